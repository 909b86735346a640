"""Request bodies: `ocrvl serve` lets uvicorn read a page whole; a whole body is not copied."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http import httptools_impl

from app.bodies import read_ahead
from app.main import create_app
from app.routes.chat import read_body
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import FakeVLLM
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


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/ocr"])
def test_a_client_leaving_mid_body_is_a_499_not_a_crash(
    path: str, fake: FakeVLLM, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends half its body and hangs up is logged as 499 (client_closed), not
    as an exception in the ASGI app with a traceback; the gateway goes on serving."""
    app = create_app(settings_for(fake.url))  # its loggers (ocrvl, uvicorn.error) propagate not
    for name in ("ocrvl", "uvicorn.error"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [caplog.handler])
    with ThreadedServer(app, http="httptools", log_config=None) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
                "Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n".encode()
                + b"x" * 20_000
            )
            time.sleep(0.3)  # the gateway has started reading the body
        deadline = time.monotonic() + 10
        while not [r for r in caplog.records if r.name == "ocrvl.access"]:
            assert time.monotonic() < deadline, "the request was never logged"
            time.sleep(0.05)
        after = httpx.get(f"{server.url}/health", timeout=10)
    access = [r for r in caplog.records if r.name == "ocrvl.access"]
    assert [r.status for r in access] == [499]  # type: ignore[attr-defined]
    crashes = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert crashes == [], [r.getMessage() for r in crashes]
    assert after.status_code == 200
