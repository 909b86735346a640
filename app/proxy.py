"""The relay: one chat request to one backend, with failover, deadlines and cancellation.

Nothing the client does is left running upstream: when the client disconnects or the deadline
passes, the upstream request is closed, which makes vLLM abort the generation and free the GPU.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.backends import Backend, BackendPool, describe
from app.chat import ChatRequest
from app.context import CLIENT_CLOSED, RequestContext
from app.errors import (
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    ClientClosed,
    GatewayError,
    UpstreamError,
)
from app.guard import Guarded
from app.scheduling import PAGE_UNITS, Lease, Scheduler, Work
from app.upstream import Body, Upstream, UpstreamResponse
from app.usage.reading import StreamUsage, ask_for_usage, count_answer, spliced

ERROR_BODY_LIMIT = 64 * 1024  # enough for any vLLM error; a runaway body is cut
# vLLM writes compact JSON; a byte search finds a cut-off answer without parsing the body.
TRUNCATED = b'"finish_reason":"length"'
MAX_REPLAYS = 1  # answers broken before their first byte reached the client, replayed elsewhere
# The backend went away while answering (killed, restarted): the page may go elsewhere.
BROKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class Relay:
    """Sends chat requests to the backends the scheduler grants and relays the answers."""

    def __init__(
        self,
        upstream: Upstream,
        pool: BackendPool,
        scheduler: Scheduler,
        *,
        backend_key: str | None,
        request_timeout: float,
        max_pixels: int,
        metering: bool = True,
        stream_interval: int = 1,
    ) -> None:
        self._upstream = upstream
        self._pool = pool
        self._scheduler = scheduler
        self._auth = {"authorization": f"Bearer {backend_key}"} if backend_key else {}
        self._timeout = request_timeout
        self._max_pixels = max_pixels
        self._metering = metering  # read each answer's usage (app/usage); off: OCRVL_USAGE=off
        self.stream_interval = stream_interval  # tokens an event of the gateway's own streams

    async def complete(
        self, chat: ChatRequest, served: str, context: RequestContext, receive: Receive
    ) -> Response:
        """Relay `chat` and answer with the backend's response, streamed or whole."""
        deadline = time.monotonic() + self._timeout - context.elapsed()
        ask = ask_for_usage(chat) if self._metering else None  # a stream's usage chunk
        async with Guarded(receive, deadline, self._timeout, context):
            lease, upstream, head, rest = await self._answer(chat, served, context, ask is True)
            if rest is not None:  # a stream: from here it guards itself
                context.answered += 1
                usage = StreamUsage(context, strip=ask is not None) if self._metering else None
                return RelayStream(
                    upstream, (head, rest), lease, context, deadline=deadline,
                    timeout=self._timeout, usage=usage,
                )  # fmt: skip
        context.truncated = TRUNCATED in head
        if self._metering:
            count_answer(context, head)
        media_type = upstream.headers.get("content-type", "application/json")
        return Response(head, status_code=upstream.status_code, media_type=media_type)

    async def watch(
        self,
        chat: ChatRequest,
        served: str,
        context: RequestContext,
        receive: Receive,
        reader: Callable[[bytes], Awaitable[bool]],
    ) -> None:
        """Relay `chat` (a stream) and hand each chunk of its answer to `reader` until the
        answer ends or `reader` has had enough (returns False): the stream is then closed, and
        vLLM aborts the rest of the generation (app/documents/streams.py, the loop guard)."""
        deadline = time.monotonic() + self._timeout - context.elapsed()
        async with Guarded(receive, deadline, self._timeout, context):
            lease, upstream, head, rest = await self._answer(chat, served, context)
            context.answered += 1
            usage = StreamUsage(context, strip=False) if self._metering else None
            try:
                chunk = head
                while chunk:
                    if usage is not None:
                        usage.feed(chunk)
                    if not await reader(chunk) or rest is None:
                        return
                    chunk = await _next(rest, context)
            finally:
                await _close(upstream, lease)

    async def _answer(
        self, chat: ChatRequest, served: str, context: RequestContext, splice: bool = False
    ) -> tuple[Lease, UpstreamResponse, bytes, AsyncIterator[bytes] | None]:
        """The upstream response and its first bytes: the whole body, or a stream's first chunk.

        Until then nothing has reached the client, so a backend that refuses the connection, or
        breaks before answering (killed, restarted), costs the client nothing: the request moves
        to another backend (a broken answer is replayed once: a page that crashes engines must
        not take them all down). A non-streaming answer's slot is released here. `splice`: the
        body is to ask for the usage chunk (`ask_for_usage`).
        """
        raw = chat.take_body(served, self._max_pixels)
        body: Body = spliced(raw) if splice else raw
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if chat.stream else "application/json",
            "x-request-id": context.request_id,
            **self._auth,
        }
        tried: set[str] = set()
        failures: list[str] = []
        replays = 0
        # `n` > 1 decodes n sequences at once on one backend: n pages of work (a layout
        # block brings its own units; docs/admission.md)
        work = Work(chat.units or chat.pages * PAGE_UNITS, chat.pages)
        while True:
            lease = await self._admit(served, context, frozenset(tried), failures, work)
            backend = lease.backend
            context.backend = backend.url
            upstream = None
            try:
                upstream = await self._send(backend, body, headers, context)
                if upstream.status_code >= 400:
                    raise await _rejection(upstream, context)  # noqa: TRY301 (closed below)
                head, rest = await _head(upstream, context, whole=not chat.stream)
            except BackendRejected as exc:
                await _close(upstream, lease)
                if not stopping(exc):
                    raise
                # a draining engine took nothing: another backend may take the page
                context.upstream_error = "stopping"
                backend.mark_stopping(exc.message)
                failures.append(f"{backend.url}: stopping ({exc.message})")
                tried.add(backend.url)
                continue
            except httpx.HTTPError as exc:
                await _close(upstream, lease)
                refused = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                context.upstream_error = "connect" if refused else "transport"
                if not refused and (not isinstance(exc, BROKEN) or replays >= MAX_REPLAYS):
                    raise BackendUnavailable(
                        f"backend {backend.url} failed: {describe(exc)}"
                    ) from exc
                replays += not refused
                backend.mark_down(describe(exc) if refused else f"broke: {describe(exc)}")
                failures.append(f"{backend.url}: {describe(exc)}")
                tried.add(backend.url)
                continue
            except BaseException:
                await _close(upstream, lease)
                raise
            if rest is None:
                await _close(upstream, lease)
            return lease, upstream, head, rest

    async def _admit(
        self,
        served: str,
        context: RequestContext,
        tried: frozenset[str],
        failures: list[str],
        work: Work,
    ) -> Lease:
        """A slot from the scheduler (waiting in its queue if need be), or why there is none."""
        started = time.perf_counter()
        try:
            key = context.key_name or "anonymous"
            lease = await self._scheduler.acquire(served, key, tried, work)
        finally:
            context.queued_seconds += time.perf_counter() - started
        if lease is not None:
            return lease
        if failures:
            raise BackendUnavailable("could not connect to any backend: " + "; ".join(failures))
        raise self._pool.unavailable(f"no healthy backend serves {served!r}")

    async def _send(
        self, backend: Backend, body: Body, headers: dict[str, str], context: RequestContext
    ) -> UpstreamResponse:
        started = time.perf_counter()
        try:
            return await self._upstream.post(backend.url, "/v1/chat/completions", headers, body)
        finally:
            context.upstream_seconds += time.perf_counter() - started


class RelayStream(Response):
    """Passes the backend's SSE bytes to the client as they arrive, unparsed and unbuffered."""

    def __init__(
        self,
        upstream: UpstreamResponse,
        chunks: tuple[bytes, AsyncIterator[bytes]],
        lease: Lease,
        context: RequestContext,
        *,
        deadline: float,
        timeout: float,
        usage: StreamUsage | None = None,
    ) -> None:
        self.status_code = upstream.status_code
        self.background = None
        self.init_headers(
            {
                "content-type": upstream.headers.get("content-type", "text/event-stream"),
                "cache-control": "no-cache",
                "x-accel-buffering": "no",
            }
        )
        self._upstream = upstream
        self._head, self._rest = chunks
        self._lease = lease
        self._context = context
        self._deadline = deadline
        self._timeout = timeout
        self._ended = False  # the last chunk went out as the end of the body
        self._usage = usage  # reads the usage event (and takes it out if the gateway asked)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error: GatewayError | None
        try:
            try:
                async with Guarded(receive, self._deadline, self._timeout, self._context):
                    error = await self._pump(send)
            except BackendTimeout as timeout:
                error = timeout
            if error is not None:  # headers are out: the error can only be an SSE event
                event = b"data: " + orjson.dumps(error.body()) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            if not self._ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except ClientClosed:
            self._context.status = CLIENT_CLOSED
        finally:
            await _close(self._upstream, self._lease)

    async def _pump(self, send: Send) -> GatewayError | None:
        """Copy upstream chunks to the client; a broken upstream becomes the returned error.

        The last chunk, when the answer's end came with it (as vLLM's `[DONE]` usually does),
        goes out as the end of the body: one write for both.
        """
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        chunk, self._head = self._head, b""
        chunks = self._rest
        while True:
            if TRUNCATED in chunk:
                self._context.truncated = True
            if self._usage is not None:
                chunk = self._usage.feed(chunk)
            if self._upstream.drained():
                if self._usage is not None:
                    chunk += self._usage.rest()
                await send({"type": "http.response.body", "body": chunk, "more_body": False})
                self._ended = True
                await anext(chunks, None)  # ends the iterator here, not in a finalizer task
                return None
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            started = time.perf_counter()
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                if self._usage is not None and (held := self._usage.rest()):
                    await send({"type": "http.response.body", "body": held, "more_body": True})
                return None
            except httpx.HTTPError as exc:
                self._context.upstream_error = "stream_broken"
                return UpstreamError(f"the backend's stream broke: {describe(exc)}")
            finally:
                self._context.upstream_seconds += time.perf_counter() - started


async def _next(chunks: AsyncIterator[bytes], context: RequestContext) -> bytes:
    """A stream's next chunk (b"" at its end); a broken stream raises UpstreamError."""
    started = time.perf_counter()
    try:
        return await anext(chunks, b"")
    except httpx.HTTPError as exc:
        context.upstream_error = "stream_broken"
        raise UpstreamError(f"the backend's stream broke: {describe(exc)}") from exc
    finally:
        context.upstream_seconds += time.perf_counter() - started


async def _head(
    upstream: UpstreamResponse, context: RequestContext, *, whole: bool
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The whole body, or a stream's first chunk and the iterator of the rest."""
    started = time.perf_counter()
    try:
        chunks = upstream.aiter_raw()
        if not whole:
            return await anext(chunks, b""), chunks
        body = [chunk async for chunk in chunks]
        return (body[0] if len(body) == 1 else b"".join(body)), None
    finally:
        context.upstream_seconds += time.perf_counter() - started


async def _rejection(upstream: UpstreamResponse, context: RequestContext) -> BackendRejected:
    """The backend's error status and body as the error to answer (body read up to a cap)."""
    started = time.perf_counter()
    try:
        chunks, size = [], 0
        async for chunk in upstream.aiter_raw():
            chunks.append(chunk)
            size += len(chunk)
            if size >= ERROR_BODY_LIMIT:
                break
    finally:
        context.upstream_seconds += time.perf_counter() - started
    context.upstream_error = f"status_{upstream.status_code // 100}xx"
    return backend_error(upstream.status_code, b"".join(chunks))


async def _close(upstream: UpstreamResponse | None, lease: Lease) -> None:
    """Close the upstream response (vLLM aborts an unfinished request) and free the slot."""
    try:
        if upstream is not None:
            await upstream.aclose()
    finally:
        lease.release()


def backend_error(status: int, raw: bytes) -> BackendRejected:
    """The backend's error in OpenAI's shape, whichever of vLLM's shapes it came in."""
    fallback_type = "invalid_request_error" if status < 500 else "server_error"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    fields: dict[str, Any] = {}
    if isinstance(body, dict):
        # vLLM answers {"error": {...}}; older versions {"object": "error", "message": ...};
        # its API-key middleware {"error": "Unauthorized"}
        error = body.get("error")
        fields = error if isinstance(error, dict) else body
        if isinstance(error, str):
            fields = {"message": error}
    if status in (401, 403):  # the gateway's own key was refused: not the client's fault
        return BackendRejected(
            502,
            f"the backend refused the gateway's credentials ({status}); "
            "check OCRVL_BACKEND_API_KEY against vLLM's --api-key",
            type_="server_error",
            param=None,
            code="backend_auth_failed",
        )
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        text = raw.decode("utf-8", "replace").strip()[:500]
        message = f"the backend answered {status}" + (f": {text}" if text else "")
    param = fields.get("param") if isinstance(fields.get("param"), str) else None
    code = fields.get("code")
    # vLLM's code is its HTTP status and its type a Python class name: the gateway's own
    # vocabulary instead, and no internals (object reprs, the processor's inputs) in the message
    if not isinstance(code, str) or not code or code.isdigit():
        code = "invalid_request" if status < 500 else "backend_error"
    message = scrubbed(message)
    if status < 500 and IMAGE_TROUBLE.search(message):
        code, param = "invalid_image", param or "messages"
    return BackendRejected(status, message, type_=fallback_type, param=param, code=code)


# vLLM 0.32 draining on SIGTERM (its `shutdown-timeout`): a new request is answered 500 with
# "cannot schedule new futures after shutdown" (a utility call: "Server shutting down"), and
# nothing of it ran
STOPPING = re.compile(r"after shutdown|shutting down", re.IGNORECASE)


def stopping(error: BackendRejected) -> bool:
    """Whether the backend refused the request because it is stopping (nothing ran)."""
    return error.status >= 500 and STOPPING.search(error.message) is not None


# vLLM's messages of an image its processor could not take (PIL, the HF processor)
IMAGE_TROUBLE = re.compile(r"image|Failed to apply \w+Processor", re.IGNORECASE)
PROCESSOR_INPUTS = re.compile(r"(Failed to apply \w+) on data=.*", re.DOTALL)
REPR = re.compile(r"\s*<(?:[A-Za-z_]\w*\.)+\w+(?:\s[^<>]*)?>")  # <PIL.Image.Image ...>


def scrubbed(message: str) -> str:
    """A backend's message without Python internals: object reprs go, and a processor error's
    echo of its inputs becomes what it means."""
    message = PROCESSOR_INPUTS.sub(
        r"\1: the engine's image processor could not take an image of the request", message
    )
    return REPR.sub("", message)
