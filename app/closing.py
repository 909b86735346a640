"""The lifespan's shutdown: every close step bounded, timed and named in the log.

`Closing` is the exit stack the lifespan opens everything on. It unwinds as any exit stack does,
in the reverse order of opening, but each step (a callback, a context's exit) runs as a task of
its own, waited for at most `bound` seconds (OCRVL_CLOSE_TIMEOUT):

- a step that ends is logged at debug with its duration;
- a step that raises is logged (ERROR) with its error, and the rest still close;
- a step still running at the bound is cancelled and left behind with a WARNING naming it and
  the bound, and the rest still close;
- at the end, one info line: how many steps, how long, which were abandoned or failed.

A step runs in a task of its own so that one that swallows its cancellation (an await under
`suppress(CancelledError)`) cannot hold the shutdown. What cannot be abandoned: a synchronous
callback runs on the event loop (it is timed, never cut: keep such steps to in-memory work); a
thread (`asyncio.to_thread`) goes on, and Python still waits for it as the process exits, as
asyncio does for a task that ignores its cancellation; the rest of the gateway has closed by
then, and the deployment's grace ends the process. The exit
stack's other ways in (`enter_context`, `push`, `push_async_exit`), which the gateway does not
use, stay as they are: unbounded and unlogged.

Steps are named by what closes (`Quotas.close`, `to_thread(Preprocessor.close)`, `metering`,
`AsyncClient`, `cancelled(BackendPool.watch)`) and their place in the opening order (`#3`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import ModuleType, TracebackType
from typing import Any, TypeVar

log = logging.getLogger("ocrvl.closing")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def named(what: object) -> str:
    """A close step's callable (or argument) by name: `Class.method`, a function's qualified
    name, a task's name, else its type; never its value (a secret may be one)."""
    owner = getattr(what, "__self__", None)
    if owner is not None and not isinstance(owner, ModuleType):
        return f"{type(owner).__qualname__}.{getattr(what, '__name__', '?')}"
    if isinstance(what, asyncio.Task):
        return what.get_name()
    if callable(what) and hasattr(what, "__qualname__"):
        return str(what.__qualname__)
    return type(what).__qualname__


def context_name(context: object) -> str:
    """A context by name: an `@asynccontextmanager`'s function, else its type."""
    generator = getattr(context, "gen", None)
    return str(getattr(generator, "__qualname__", "")) or type(context).__qualname__


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait for it to end (a background task's close step)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Closing(AsyncExitStack):
    """An exit stack whose every step is bounded by `bound` seconds, timed and logged."""

    def __init__(self, bound: float) -> None:
        super().__init__()
        self.bound = bound
        self.abandoned: set[asyncio.Task[Any]] = set()  # held until they end: never collected
        self._opened = 0
        self._left: list[str] = []  # the steps abandoned
        self._failed: list[str] = []

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        """Close every step, then say in one line (info) how the shutdown went."""
        started = time.monotonic()
        try:
            return bool(await super().__aexit__(kind, exc, tb))
        finally:
            log.info(
                "shutdown: %d step(s) closed in %.3f s; abandoned: %s; failed: %s", self._opened,
                time.monotonic() - started, ", ".join(self._left) or "none",
                ", ".join(self._failed) or "none",
            )  # fmt: skip

    def callback(self, callback: F, /, *args: Any, **kwds: Any) -> F:
        """Register a synchronous close step (run on the event loop: timed, never cut)."""

        async def call() -> None:
            callback(*args, **kwds)

        super().push_async_callback(self._close, self._step(callback, args), call)
        return callback

    def push_async_callback(self, callback: F, /, *args: Any, **kwds: Any) -> F:
        """Register an async close step, bounded."""
        super().push_async_callback(
            self._close, self._step(callback, args), lambda: callback(*args, **kwds)
        )
        return callback

    async def enter_async_context(self, cm: AbstractAsyncContextManager[T]) -> T:
        """Enter `cm`; its exit is a bounded close step."""
        step = self._numbered(context_name(cm))
        return await super().enter_async_context(_BoundedExit(cm, step, self))

    def _step(self, callback: Callable[..., Any], args: tuple[Any, ...]) -> str:
        inner = ", ".join(named(arg) for arg in args)
        return self._numbered(f"{named(callback)}({inner})" if inner else named(callback))

    def _numbered(self, name: str) -> str:
        self._opened += 1
        return f"#{self._opened} {name}"

    async def _close(self, step: str, close: Callable[[], Awaitable[T]]) -> T | None:
        """Run `close()` as a task for at most `bound` seconds; its result, or None when it
        raised or was abandoned (each logged)."""
        started = time.monotonic()

        async def run() -> T:
            return await close()

        task = asyncio.create_task(run(), name=f"close {step}")
        try:
            await asyncio.wait({task}, timeout=self.bound)
        except asyncio.CancelledError:  # the shutdown itself was cancelled
            task.cancel()
            raise
        took = round(time.monotonic() - started, 3)
        facts = {"step": step, "seconds": took}
        if not task.done():
            task.cancel()
            self.abandoned.add(task)
            task.add_done_callback(_forget(self.abandoned))
            self._left.append(step)
            log.warning(
                "shutdown: %s did not finish within %g s (OCRVL_CLOSE_TIMEOUT); abandoned, "
                "the rest still close", step, self.bound, extra=facts,
            )  # fmt: skip
            return None
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            why = "cancelled" if error is None else f"{type(error).__name__}: {error}"
            self._failed.append(step)
            log.error("shutdown: %s failed after %.3f s (%s); the rest still close",
                      step, took, why, exc_info=error, extra=facts)  # fmt: skip
            return None
        log.debug("shutdown: closed %s in %.3f s", step, took, extra=facts)
        return task.result()


def _forget(abandoned: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def forget(task: asyncio.Task[Any]) -> None:
        abandoned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("shutdown: an abandoned step ended late: %r", task.exception())

    return forget


class _BoundedExit:
    """`cm` entered as is; its exit run as one of `closing`'s bounded steps (an exit that
    raises or is abandoned suppresses nothing)."""

    def __init__(self, cm: AbstractAsyncContextManager[Any], step: str, closing: Closing) -> None:
        self._cm = cm
        self._step = step
        self._closing = closing

    async def __aenter__(self) -> Any:
        return await self._cm.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        suppressed = await self._closing._close(
            self._step, lambda: self._cm.__aexit__(kind, exc, tb)
        )
        return bool(suppressed)
