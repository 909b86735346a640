"""What one request to each API under `bench.gpu.steady` is.

`chat`: PaddleOCR's chat body around a page, sent by `ocrvl bench sweep`'s own `send`
(app/bench/load.py). `layout`: the layout service's `POST /v1/layout` with one page as a data URL
(issue 36's contract: `{"images": [...]}` in, `{"results": [{"boxes": [...]}]}` out), so the
batches it forms are the service's own work, across requests; the boxes answered count as the
request's "tokens".
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import httpx
import orjson

from app.bench.corpus import Page
from app.bench.load import Outcome, Shape, Target, auth, send

Sender = Callable[[httpx.AsyncClient, Page], Awaitable[Outcome]]


def chat(target: Target, shape: Shape) -> Sender:
    """A chat completion for the page (the sweep's request)."""

    async def one(client: httpx.AsyncClient, page: Page) -> Outcome:
        return await send(client, target, shape.body(page, target.model), stream=False)

    return one


def layout(target: Target) -> Sender:
    """The layout service's answer for the page alone."""
    headers = {"content-type": "application/json"} | auth(target.key)

    async def one(client: httpx.AsyncClient, page: Page) -> Outcome:
        body = b'{"images":["data:' + page.mime.encode() + b";base64," + page.b64 + b'"]}'
        start = time.perf_counter()
        outcome = Outcome(start, start, 0)
        try:
            reply = await client.post(f"{target.url}/v1/layout", content=body, headers=headers)
            outcome.status = reply.status_code
            if reply.status_code == 200:
                outcome.tokens = len(orjson.loads(reply.content)["results"][0]["boxes"])
            else:
                outcome.message = reply.text[:300]
        except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, IndexError) as exc:
            outcome.status, outcome.message = type(exc).__name__, str(exc)[:300]
        outcome.end = time.perf_counter()
        return outcome

    return one
