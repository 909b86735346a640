"""The guard around a relayed request: the client leaving or the deadline passing ends it.

Nothing the client does is left running upstream: the guard cancels the block that talks to the
backend, which closes the upstream request, so vLLM aborts the generation and frees the GPU.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import Receive

from app.context import RequestContext
from app.errors import BackendTimeout, ClientClosed


class Guarded:
    """`async with Guarded(...)`: cancel the block when the client leaves (ClientClosed) or at
    `deadline` (BackendTimeout).

    Cancelling closes whatever upstream request is open, so vLLM aborts it. The block runs in
    the request's own task; one watcher task per request listens for the disconnect, one timer
    handle ends it at the deadline. (A class, not asyncio.timeout in a generator: this runs for
    every page, and on Python 3.11 each lookup of the running loop is a getpid() system call.)
    """

    __slots__ = (
        "_cause",
        "_context",
        "_deadline",
        "_limit",
        "_receive",
        "_task",
        "_timer",
        "_watcher",
    )

    def __init__(
        self, receive: Receive, deadline: float, limit: float, context: RequestContext
    ) -> None:
        self._receive = receive
        self._deadline = deadline
        self._limit = limit
        self._context = context
        self._cause: str | None = None  # what cancelled the block: "disconnect" or "timeout"

    async def __aenter__(self) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None  # noqa: S101 (always inside a request task)
        self._task = task
        self._watcher = loop.create_task(self._watch())
        self._timer = loop.call_later(max(self._deadline - time.monotonic(), 0), self._expire)

    async def _watch(self) -> None:
        await until_disconnected(self._receive)
        self._context.upstream_error = "client_disconnect"
        self._cancel("disconnect")

    def _expire(self) -> None:
        self._cancel("timeout")

    def _cancel(self, cause: str) -> None:
        if self._cause is None:
            self._cause = cause
            self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._watcher.cancel()
        self._timer.cancel()
        if self._cause is None:
            return
        self._task.uncancel()
        if kind is None or not issubclass(kind, asyncio.CancelledError):
            return  # ended before the cancellation reached it (or failed on its own)
        if self._cause == "disconnect":
            raise ClientClosed(
                "the client closed the connection; the upstream request was closed"
            ) from None
        self._context.upstream_error = "timeout"
        raise BackendTimeout(
            f"no complete answer within {self._limit:g} s (OCRVL_REQUEST_TIMEOUT); "
            "the upstream request was closed"
        ) from None


async def until_disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
