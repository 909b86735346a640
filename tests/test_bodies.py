"""Request bodies: `ocrvl serve` lets uvicorn read a page whole; a whole body is not copied."""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
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
    # uvicorn stopped reading the request: it has the whole body, or it paused the socket
    stopped = threading.Event()
    protocol = httptools_impl.HttpToolsProtocol
    on_body, on_message_complete = protocol.on_body, protocol.on_message_complete

    def body_read(self: httptools_impl.HttpToolsProtocol, body: bytes) -> None:
        on_body(self, body)
        if self.flow.read_paused:
            stopped.set()

    def message_read(self: httptools_impl.HttpToolsProtocol) -> None:
        on_message_complete(self)
        stopped.set()

    monkeypatch.setattr(protocol, "on_body", body_read)
    monkeypatch.setattr(protocol, "on_message_complete", message_read)
    waited: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        # busy elsewhere until uvicorn has read all it will read before the app asks
        waited.append(await asyncio.to_thread(stopped.wait, 15))
        first.append(await receive())
        while first[-1].get("more_body"):
            first.append(await receive())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with ThreadedServer(app, http="httptools", lifespan="off") as server:
        response = httpx.post(server.url, content=b"x" * PAGE, timeout=10)
    assert waited == [True], "uvicorn neither read the whole body nor paused within 15 s"
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
    reading = threading.Event()
    with ThreadedServer(taking_body(app, reading), http="httptools", log_config=None) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
                "Content-Type: application/json\r\nContent-Length: 200000\r\n\r\n".encode()
                + b"x" * 20_000
            )
            assert reading.wait(15), "the gateway never started reading the body"
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


def taking_body(app: ASGIApp, reading: threading.Event) -> ASGIApp:
    """`app`, setting `reading` once it has taken a first part of a request body."""

    async def watched(scope: Scope, receive: Receive, send: Send) -> None:
        async def taken() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                reading.set()
            return message

        await app(scope, taken if scope["type"] == "http" else receive, send)

    return watched


def chunked_over_the_limit(port: int, path: str, content_type: str) -> tuple[bytes, int, bool]:
    """Send a 64 MB body to `path` in 64 KiB chunks without Content-Length, reading the socket
    between chunks; stop once an answer comes. (The answer's head and body, the bytes sent by
    then, whether the server closed the connection after its answer.)"""
    planned, chunk = 64 * 1024 * 1024, b"A" * 65536
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
            f"Content-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        if content_type.startswith("multipart/"):  # a file part that never ends
            part = b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.pdf"\r\n\r\n'
            client.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        try:
            while sent < planned:
                if select.select([client], [], [], 0)[0]:
                    break  # the answer (or the close) came before the body ended
                client.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed after its answer: the answer is in our socket's buffer
        closed = False
        client.settimeout(10)  # an open connection: the server would go on reading the body
        try:
            while data := client.recv(65536):
                answer += data
            closed = True
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
    return answer, sent, closed


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/chat/completions", "application/json"),
        ("/v1/ocr", "application/json"),
        ("/v1/ocr", "multipart/form-data; boundary=x"),
        ("/v1/ocr/jobs", "application/json"),
        ("/layout-parsing", "application/json"),
        ("/v1/batches", "application/json"),
        ("/v1/files", "multipart/form-data; boundary=x"),
    ],
)
def test_a_chunked_body_over_the_limit_is_a_413_before_it_ends_and_the_connection_closes(
    path: str, content_type: str, fake: FakeVLLM
) -> None:
    """A body sent without Content-Length is counted as it arrives: past the route's limit the
    gateway answers 413 in the route's error shape while the client is still sending (well
    before the 64 MB end), with `Connection: close`, and closes the connection: it reads no
    more of the body."""
    settings = settings_for(
        fake.url, max_body_bytes=256 * 1024, max_file_bytes=256 * 1024,
        batch_max_file_bytes=256 * 1024, job_max_file_bytes=256 * 1024,
    )  # fmt: skip
    with ThreadedServer(create_app(settings), http="httptools", log_config=None) as server:
        answer, sent, closed = chunked_over_the_limit(server.port, path, content_type)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"\r\nconnection: close" in head.lower()
    assert sent < 16 * 1024 * 1024  # the limit, plus what the sockets' buffers took
    assert closed
    error = json_body(body)
    if path == "/layout-parsing":
        assert error["errorCode"] == 413
    else:
        assert error["error"]["code"] == "request_too_large"


def json_body(body: bytes) -> dict[str, Any]:
    """A response body sent whole or in chunks (`Transfer-Encoding: chunked`), as JSON."""
    if body.startswith(b"{"):
        return dict(orjson.loads(body))
    joined, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        joined, rest = joined + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    return dict(orjson.loads(joined))
