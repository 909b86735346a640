"""The relay's HTTP/1.1 client: keep-alive reuse, streamed bodies, failures as httpx types, TLS."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from app.upstream import Upstream, trust
from tests.support.servers import free_port
from tests.support.tls import server_context
from tests.support.waits import WAIT, until

pytestmark = pytest.mark.anyio
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Serve = Callable[..., Awaitable[str]]  # (handler, tls=None): the server's base URL
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request: head and content-length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


class KeepAnswering:
    """A handler answering OK to each request until the client closes its connection: the
    connections it was given, and every request it read."""

    def __init__(self) -> None:
        self.connections = 0
        self.bodies: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                self.bodies.append(await read_request(reader))
            except (asyncio.IncompleteReadError, ConnectionResetError):
                return
            writer.write(OK)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a raw TCP server on loopback with the given connection handler (over TLS with
    `tls`, a server context); its base URL."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler, tls: ssl.SSLContext | None = None) -> str:
        async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await handler(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(closing, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        scheme = "https" if tls else "http"
        return f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def post(upstream: Upstream, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await upstream.post(url, "/v1/chat/completions", {"x-test": "1"}, body)
    try:
        return response.status_code, b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()


async def test_sequential_requests_share_one_keep_alive_connection(serve: Serve) -> None:
    """Three requests in a row travel on one connection, each body arriving whole."""
    backend = KeepAnswering()
    url = await serve(backend)
    upstream = Upstream(10, 4.0, 1.0)
    results = [await post(upstream, url, b'{"n": %d}' % i) for i in range(3)]
    upstream.close()
    assert results == [(200, b"{}")] * 3
    assert backend.connections == 1
    bodies = backend.bodies
    assert [b.rsplit(b"\r\n", 1)[1] for b in bodies] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    assert b"x-test: 1" in bodies[0]


async def test_a_chunked_stream_arrives_piece_by_piece(serve: Serve) -> None:
    """A chunked answer is handed on chunk by chunk, framing removed."""
    taken = [asyncio.Event(), asyncio.Event()]  # the relay has handed on chunk 1, chunk 2

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part, handed_on in zip((b"data: a\n\n", b"data: b\n\n"), taken, strict=True):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.wait_for(handed_on.wait(), WAIT)  # the next one comes apart
        writer.write(b"0\r\n\r\n")

    url = await serve(handler)
    upstream = Upstream(10, 4.0, 1.0)
    response = await upstream.post(url, "/v1/chat/completions", {}, b"{}")
    chunks: list[bytes] = []
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        if len(chunks) <= len(taken):
            taken[len(chunks) - 1].set()
    await response.aclose()
    upstream.close()
    assert chunks == [b"data: a\n\n", b"data: b\n\n"]


async def test_chunks_that_arrived_together_are_handed_on_together(serve: Serve) -> None:
    """Chunks already in when the relay asks come as one piece (one send to the client, not
    one each); once the answer's end is in and handed on, the response says it is drained."""
    go_on, sent = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await go_on.wait()
        for part in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        sent.set()

    url = await serve(handler)
    upstream = Upstream(10, 4.0, 1.0)
    response = await upstream.post(url, "/v1/chat/completions", {}, b"{}")
    go_on.set()
    await asyncio.wait_for(sent.wait(), WAIT)
    # the whole answer, its end included, read into the connection's buffer (nothing taken yet)
    await until(lambda: response._connection.complete, "the answer's end never came in")
    assert not response.drained()
    chunks = [chunk async for chunk in response.aiter_raw()]
    assert response.drained()
    await response.aclose()
    upstream.close()
    assert chunks == [b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"]


async def test_a_refused_connection_is_a_connect_error() -> None:
    """Nothing listening: httpx.ConnectError, so the relay tries another backend."""
    upstream = Upstream(10, 4.0, 1.0)
    with pytest.raises(httpx.ConnectError):
        await post(upstream, f"http://127.0.0.1:{free_port()}")


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"", httpx.RemoteProtocolError),  # closed without a byte
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{}", httpx.RemoteProtocolError),
        (b"NOT HTTP AT ALL\r\n\r\n", httpx.RemoteProtocolError),
    ],
    ids=["closed-before-answering", "closed-mid-body", "malformed"],
)
async def test_a_backend_that_breaks_raises_httpx_errors(
    serve: Serve, reply: bytes, error: type[Exception]
) -> None:
    """The relay reads these as 'broke before answering' (replayed) or a broken stream."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        writer.close()

    url = await serve(handler)
    upstream = Upstream(10, 4.0, 1.0)
    with pytest.raises(error):
        await post(upstream, url)


async def test_an_idle_connection_the_backend_closed_is_replaced_transparently(
    serve: Serve,
) -> None:
    """The keep-alive race: the pooled connection was closed by the backend; the request goes
    out again on a new connection instead of failing."""
    connections = 0
    pooled, expired = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if connections == 1:
            await asyncio.wait_for(pooled.wait(), WAIT)  # idle in the relay's pool now
            writer.close()  # a server whose keep-alive expired
            await writer.wait_closed()
            expired.set()
            return
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(OK)

    url = await serve(handler)
    upstream = Upstream(10, 4.0, 1.0)
    assert await post(upstream, url) == (200, b"{}")  # read whole: its connection is pooled
    pooled.set()
    await asyncio.wait_for(expired.wait(), WAIT)  # the server has closed the idle connection
    assert await post(upstream, url) == (200, b"{}")
    upstream.close()
    assert connections == 2


async def test_a_cancelled_request_closes_its_connection(serve: Serve) -> None:
    """Cancelling while the backend works closes the connection: vLLM aborts the request."""
    working, closed = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        working.set()
        await reader.read()  # until the gateway hangs up
        closed.set()

    url = await serve(handler)
    upstream = Upstream(10, 4.0, 1.0)
    task = asyncio.create_task(post(upstream, url))
    await asyncio.wait_for(working.wait(), WAIT)  # the backend has the request
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(closed.wait(), WAIT)


async def test_an_https_backend_is_spoken_to_over_tls_on_one_kept_alive_connection(
    serve: Serve, certificate: tuple[Path, Path]
) -> None:
    """An https:// base URL: the request goes over TLS (the server reads it decrypted), its
    certificate verified against the CA the client trusts, and the connection is kept alive."""
    backend = KeepAnswering()
    url = await serve(backend, server_context(certificate))
    trusting = trust(certificate[0])
    upstream = Upstream(10, 4.0, 1.0, tls=trusting)
    try:
        results = [await post(upstream, url) for _ in range(2)]
    finally:
        upstream.close()
    assert results == [(200, b"{}")] * 2
    assert backend.connections == 1
    assert backend.bodies[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")


async def test_an_https_backend_whose_certificate_does_not_verify_is_a_connect_error(
    serve: Serve, certificate: tuple[Path, Path]
) -> None:
    """With httpx's own trust (certifi's CAs), a self-signed certificate fails the handshake: a
    ConnectError that says so (the relay tries another backend), nothing sent in the clear."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(100))

    url = await serve(handler, server_context(certificate))
    upstream = Upstream(10, 4.0, 1.0)
    try:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await post(upstream, url)
    finally:
        upstream.close()
    assert all(b"POST" not in data for data in seen)
