"""Request bodies: `ocrvl serve` lets uvicorn read a page whole; a whole body is not copied."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http import httptools_impl

from app.bodies import read_ahead
from app.routes.chat import read_body
from tests.support.servers import ThreadedServer

PAGE = 700 * 1024  # a page's body, well over uvicorn's own 64 KiB and one socket read


@pytest.mark.parametrize("ahead", [True, False], ids=["read_ahead", "uvicorn_default"])
def test_uvicorn_buffers_a_whole_page_until_the_app_takes_it(
    ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `read_ahead` (as `ocrvl serve` runs it) a page the app has not asked for yet is
    read whole, so it arrives as one message; at uvicorn's default the socket is paused and
    the first message holds only part of it."""
    monkeypatch.setattr(httptools_impl, "HIGH_WATER_LIMIT", httptools_impl.HIGH_WATER_LIMIT)
    if ahead:
        read_ahead()
    first: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(0.3)  # busy elsewhere: the client has sent everything by now
        first.append(await receive())
        while first[-1].get("more_body"):
            first.append(await receive())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with ThreadedServer(app, http="httptools", lifespan="off") as server:
        response = httpx.post(server.url, content=b"x" * PAGE, timeout=10)
    assert response.status_code == 204
    assert sum(len(message["body"]) for message in first) == PAGE
    assert (len(first[0]["body"]) == PAGE) is ahead


@pytest.mark.anyio
async def test_a_body_that_came_whole_is_read_without_a_copy() -> None:
    """The chat route's reader hands on the very bytes uvicorn gave (no join of a trailing
    empty chunk), so a page costs no second copy here."""
    body = b'{"model":"m","messages":[]}' + b" " * PAGE
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        return messages.pop(0)

    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    assert await read_body(Request(scope, receive), limit=2 * PAGE) is body
