"""The process pool that rasterises, resizes and encodes pages (OCRVL_PREPROCESS_WORKERS).

Image work is CPU-bound and holds the GIL, so it runs in other processes: the event loop only
waits for results. The lifespan creates the pool and shuts it down, after the requests in flight
have drained (a worker still on a page CLOSE_GRACE seconds later is killed: nobody waits for
that page any more, and the stop must not wait for it either). Each worker runs in a session of
its own, so a SIGTERM or Ctrl-C sent to the gateway's process group (a service manager, `make
serve`, a terminal) reaches the gateway alone, never the workers its draining requests still need.

A worker that dies all the same (killed, the OOM killer, a decoder crash) breaks the pool: every
task it held fails. Those tasks are tried again on a fresh pool; a page whose worker dies on
each of its ATTEMPTS is the page's own doing (a malformed file), and only that is reported.

A gateway killed outright (`kill -9`, the OOM killer) runs no shutdown: each worker watches its
parent itself (a pidfd, readable once that process has exited) and exits with it. A worker
holds both ends of its call queue, so it would never see end-of-file there, and would wait for
work for ever; multiprocessing's resource tracker exits on its own once the last worker holding
its pipe has gone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import select
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from app.documents import raster
from app.documents.errors import DocumentError
from app.documents.selection import PageSelection

log = logging.getLogger("ocrvl.documents")
WORKER_NICENESS = 10
PARENT_POLL = 1.0  # seconds between looks at the parent where there is no pidfd
ATTEMPTS = 3  # tries of a task whose worker dies before it is reported as the file's fault
CLOSE_GRACE = 1.0  # seconds a worker's page may still take once the pool closes; then killed
KILL_WAIT = 1.0  # seconds to wait for a killed worker (or the pool's thread) to be gone


def worker_started(parent: int) -> None:
    """A worker's start: out of the gateway's process group (its stop signals are the
    gateway's to act on), behind the event loop (and a co-located engine) for the CPU, and gone
    as soon as the gateway `parent` is."""
    os.setsid()
    os.nice(WORKER_NICENESS)
    watch = threading.Thread(target=_exit_with, args=(parent,), name="parent-watch", daemon=True)
    watch.start()


def _exit_with(parent: int) -> None:
    """Block until process `parent` has exited, then end this worker at once."""
    try:
        handle: int | None = os.pidfd_open(parent)
    except OSError:  # gone already (or no pidfd: Linux before 5.3)
        handle = None
    if os.getppid() == parent:  # after the open: a pid still ours was not reused
        if handle is not None:
            select.select([handle], [], [])  # readable once the process has exited
        else:
            while os.getppid() == parent:  # re-parented once the gateway is gone
                time.sleep(PARENT_POLL)
    os._exit(0)  # no cleanup: the pool it served is gone


class Preprocessor:
    """Runs `raster` functions in worker processes; a crashed pool is replaced, not fatal."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool = self._new_pool()
        self._closed = False

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn, not fork: forking a process that runs an event loop and threads copies their
        # locks in whatever state they are in
        return ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=worker_started,
            initargs=(os.getpid(),),
        )

    async def inspect(
        self, source: raster.Source, selection: PageSelection | None, max_pages: int
    ) -> list[int]:
        """The pages to read (see `raster.inspect`)."""
        pages: list[int] = await self.run(raster.inspect, source, selection, max_pages)
        return pages

    async def render(self, source: raster.Source, index: int) -> raster.RenderedPage:
        """One page ready for the model (see `raster.render`)."""
        page: raster.RenderedPage = await self.run(raster.render, source, index)
        return page

    async def run(self, function: Any, *args: Any) -> Any:
        """`function(*args)` in a worker, tried again on a fresh pool if its worker dies;
        DocumentError (preprocess_failed) once it died on every attempt."""
        for _ in range(ATTEMPTS):
            pool = self._pool
            try:
                return await asyncio.get_running_loop().run_in_executor(pool, function, *args)
            except BrokenProcessPool:
                if self._closed:  # its worker was killed by close: no fresh pool after that
                    raise
                self._replace(pool)
        raise DocumentError(
            f"the page could not be read: the worker processing it stopped on each of "
            f"{ATTEMPTS} tries (the file may be malformed, or the server is short of memory)",
            "preprocess_failed",
        )

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A fresh pool in place of `broken` (once, however many of its tasks failed)."""
        if self._pool is broken:
            log.error("a preprocessing worker died; its tasks are tried again on a new pool")
            self._pool = self._new_pool()
            broken.shutdown(wait=False, cancel_futures=True)

    def close(self, grace: float = CLOSE_GRACE) -> None:
        """Stop the workers: pending pages are cancelled, and a worker still busy after `grace`
        seconds is killed. By then the requests have drained and the jobs were handed back, so
        its page is one nobody waits for; `shutdown(wait=True)` waited for it, for ever if it
        never ended (a page that never renders), and the gateway's stop with it."""
        self._closed = True
        pool = self._pool
        workers = list((pool._processes or {}).values())  # gone from the pool once shut down
        manager = pool._executor_manager_thread  # ends once every worker has
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace
        for worker in workers:
            worker.join(max(deadline - time.monotonic(), 0))
        busy = [worker for worker in workers if worker.is_alive()]
        for worker in busy:
            worker.kill()
        for worker in busy:
            worker.join(KILL_WAIT)
        if isinstance(manager, threading.Thread):
            manager.join(KILL_WAIT)
        if busy:
            log.warning("%d preprocessing worker(s) still running %g s after the pool closed "
                        "(a page that did not end): killed", len(busy), grace)  # fmt: skip
