"""The relay's HTTP/1.1 client to the backends: pooled keep-alive connections, parsed by httptools.

One POST per page, on the hot path of every request: httpx/httpcore spent ~45 % of the
gateway's CPU here (connection-pool locks, anyio streams, h11 in pure Python, a readability
poll per reuse). This client does only what the relay needs: write the request head and body,
parse the answer with llhttp (httptools, which uvicorn already brings), hand its body on as it
arrives, and keep the connection for the next page when the answer was read to its end.
Failures raise httpx's own exception types, so the relay's failover reads them as before:

    ConnectError / ConnectTimeout   nothing was sent: another backend may take the page
    RemoteProtocolError / ReadError the backend went away before or while answering
    WriteError                      the request could not be written

An https:// backend is verified as httpx verifies it (certifi's CAs, or OCRVL_UPSTREAM_CA_FILE's
in their place: `trust`; the host's name): a certificate that does not verify is a ConnectError,
as a refused connection is.

The layout client's pages use it too (app/documents/layouts.py). Probes, metric scrapes and
media fetches keep using httpx: they are not per page.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httptools
import httpx

READ_HIGH_WATER = 256 * 1024  # buffered answer bytes before the socket stops being read


# A request body: bytes, or pieces written one after the other (no copy to join them)
Body = bytes | tuple[bytes | memoryview, ...]


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the answer being read on it."""

    def __init__(self, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        # kept: on Python 3.11 each get_running_loop() is a getpid() system call, and the
        # loop is asked for a future per answer and per wait for a stream's next chunk
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.started = False  # any byte of the answer arrived
        self.error: httpx.TransportError | None = None
        self.wakeup: asyncio.Future[None] | None = None
        self.head_done = self.loop.create_future()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        self.started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed answer ({exc})"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            if not self.started:
                error: httpx.TransportError = httpx.RemoteProtocolError(
                    "Server disconnected without sending a response."
                )
            elif exc is None:
                error = httpx.RemoteProtocolError("peer closed connection mid-answer")
            else:
                error = httpx.ReadError(str(exc) or type(exc).__name__)
            self._fail(error)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self.head_done.done():
            self.head_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful in this callback
        self.complete = True
        self._wake()

    # the reading side
    def _fail(self, error: httpx.TransportError) -> None:
        self.error = self.error or error
        if not self.head_done.done():
            self.head_done.set_exception(error)
            self.head_done.exception()  # retrieved: no "never retrieved" warning if unawaited
        self._wake()

    def _wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def next_chunk(self) -> bytes | None:
        """The answer's body that arrived since the last call (waiting for some if none did:
        what arrived together is handed on together, one send to the client instead of one per
        piece); None at its end."""
        while not self.chunks:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            self.wakeup = self.loop.create_future()
            await self.wakeup
        if len(self.chunks) == 1:
            chunk = self.chunks.popleft()
        else:
            chunk = b"".join(self.chunks)
            self.chunks.clear()
        self.buffered -= len(chunk)
        if self.buffered <= READ_HIGH_WATER // 2 and self.transport is not None:
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        """Whether the answer was read to its end on a connection that stays open."""
        return self.complete and self.keep_alive and not self.closed

    def close(self) -> None:
        """Drop the connection (an unfinished answer is aborted: vLLM stops the request)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """A backend's answer: status and headers at once, the body as it arrives."""

    def __init__(self, connection: _Connection, pool: Upstream) -> None:
        self._connection = connection
        self._pool = pool
        self.status_code = connection.status
        self.headers = connection.headers
        self._done = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked framing removed, nothing decoded)."""
        while (chunk := await self._connection.next_chunk()) is not None:
            yield chunk

    def drained(self) -> bool:
        """Whether the whole body is in and handed on: nothing more will come."""
        return self._connection.complete and not self._connection.chunks

    async def aclose(self) -> None:
        """Back to the pool if the answer was read to its end, else closed."""
        if not self._done:
            self._done = True
            self._pool.give_back(self._connection)


def trust(ca_file: Path | None) -> ssl.SSLContext | None:
    """The TLS context every https:// backend and layout service is verified with: the CA
    certificates of `ca_file` (PEM; OCRVL_UPSTREAM_CA_FILE, a private CA) in place of certifi's,
    or None for httpx's own (certifi's, made at the first https:// connection). Raises OSError
    or ssl.SSLError when the file does not load."""
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file else None


class Upstream:
    """Keep-alive connections to the backends, at most `max_connections` in use at once."""

    def __init__(
        self,
        max_connections: int,
        keepalive_expiry: float,
        connect_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._expiry = keepalive_expiry
        self._connect_timeout = connect_timeout
        self._tls = tls  # https://'s; httpx's default (certifi) at the first such connection

    async def post(
        self, base_url: str, path: str, headers: dict[str, str], body: Body
    ) -> UpstreamResponse:
        """Send a POST and return once the answer's head is in.

        A reused connection that the backend closed while idle is retried once on a new one
        (the keep-alive race); anything else raises as the module docstring says.
        """
        split = urlsplit(base_url)
        if split.scheme not in ("http", "https") or split.hostname is None:
            raise httpx.UnsupportedProtocol(f"the relay speaks http and https; got {base_url}")
        key = (split.scheme, split.hostname, split.port or (443 if split.scheme == "https" else 80))
        pieces = (body,) if isinstance(body, bytes) else body
        head = _head(path, split.netloc, headers, sum(len(piece) for piece in pieces))
        await self._slots.acquire()
        try:
            connection, reused = self._idle_connection(key), True
            if connection is None:
                connection, reused = await self._connect(key), False
            try:
                return await self._exchange(connection, head, pieces)
            except (httpx.RemoteProtocolError, httpx.WriteError):
                if not reused or connection.started:
                    raise
            return await self._exchange(await self._connect(key), head, pieces)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(
        self, connection: _Connection, head: bytes, pieces: tuple[bytes | memoryview, ...]
    ) -> UpstreamResponse:
        transport = connection.transport
        assert transport is not None  # noqa: S101 (connected)
        try:
            try:
                transport.writelines((head, *pieces))
            except (RuntimeError, OSError) as exc:  # the transport closed under us
                raise httpx.WriteError(str(exc) or type(exc).__name__) from None
            await connection.head_done
        except BaseException:
            connection.close()  # cancelled or failed mid-exchange: nothing reusable is left
            raise
        return UpstreamResponse(connection, self)

    def _idle_connection(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            fresh = now - connection.idle_since < self._expiry
            if fresh and not connection.closed and not _closing(connection):
                connection._reset()
                return connection
            connection.close()
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = _Connection(key, loop)
        scheme, host, port = key
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or httpx.create_ssl_context(trust_env=False)
        try:
            async with asyncio.timeout(self._connect_timeout):  # the TLS handshake included
                transport, _ = await loop.create_connection(
                    lambda: connection, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(
                f"no connection within {self._connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise httpx.ConnectError(f"[Errno {exc.errno}] {exc.strerror or exc}") from None
        connection.transport = transport  # uvloop may call connection_made a turn later
        return connection

    def give_back(self, connection: _Connection) -> None:
        """A response is done with its connection: keep it for the next request, or drop it."""
        self._slots.release()
        if connection.reusable():
            connection.idle_since = time.monotonic()
            self._idle.setdefault(connection.key, []).append(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Close every idle connection (the lifespan's end)."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


def _closing(connection: _Connection) -> bool:
    return connection.transport is None or connection.transport.is_closing()


def _head(path: str, host: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
