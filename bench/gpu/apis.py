"""What one request to each API under `bench.gpu.steady` is.

`chat`: PaddleOCR's chat body around a page, sent by `ocrvl bench sweep`'s own `send`
(app/bench/load.py). `layout`: the layout service's `POST /v1/layout` with one page as a data URL
(issue 36's contract: `{"images": [...]}` in, `{"results": [{"boxes": [...]}]}` out), so the
batches it forms are the service's own work, across requests; the boxes answered count as the
request's "tokens". `ocr`: `POST /v1/ocr` with the page as a JSON data URL and `layout` on or off
(the document path: with a layout each block is one chat request behind the gateway), the
answer's completion tokens as the request's "tokens", a page the answer marks failed as status
`page_error` (the route answers 200 with the page's `error`), and what each answer said about
its blocks kept in `OcrCounts` for the window's report.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

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


@dataclass
class OcrCounts:
    """What the `/v1/ocr` answers said, by request start (s from the load's start)."""

    blocks: list[tuple[float, int]] = field(default_factory=list)  # (start, blocks read)
    prompt_tokens: list[tuple[float, int]] = field(default_factory=list)
    layouts: Counter[str] = field(default_factory=Counter)  # the answers' `layout`
    errors: Counter[str] = field(default_factory=Counter)  # pages' error codes


def ocr(target: Target, *, layout: str, max_tokens: int, counts: OcrCounts) -> Sender:
    """The page through `/v1/ocr` (JSON body, the page as a data URL), layout `on` or `off`."""
    headers = {"content-type": "application/json"} | auth(target.key)
    tail = orjson.dumps({"layout": layout, "max_tokens": max_tokens})[1:]

    async def one(client: httpx.AsyncClient, page: Page) -> Outcome:
        body = b'{"file":"data:' + page.mime.encode() + b";base64," + page.b64 + b'",' + tail
        start = time.perf_counter()
        outcome = Outcome(start, start, 0)
        try:
            reply = await client.post(f"{target.url}/v1/ocr", content=body, headers=headers)
            outcome.status = reply.status_code
            if reply.status_code == 200:
                answer = orjson.loads(reply.content)
                read = answer["pages"][0]
                usage = read.get("usage") or {}
                outcome.tokens = int(usage.get("completion_tokens") or 0)
                counts.layouts[str(answer.get("layout"))] += 1
                counts.blocks.append((start, len(read.get("blocks") or [])))
                counts.prompt_tokens.append((start, int(usage.get("prompt_tokens") or 0)))
                if read.get("error"):
                    error = read["error"]
                    code = error.get("code") or error.get("type") if isinstance(error, dict) else 0
                    counts.errors[str(code)] += 1
                    outcome.status, outcome.message = "page_error", str(error)[:300]
            else:
                outcome.message = reply.text[:300]
        except (httpx.HTTPError, orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            outcome.status, outcome.message = type(exc).__name__, str(exc)[:300]
        outcome.end = time.perf_counter()
        return outcome

    return one
