"""The process pool that rasterises, resizes and encodes pages (OCRVL_PREPROCESS_WORKERS).

Image work is CPU-bound and holds the GIL, so it runs in other processes: the event loop only
waits for results. The lifespan creates the pool and shuts it down.

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


def worker_started(parent: int) -> None:
    """A worker's start: behind the event loop (and a co-located engine) for the CPU, and gone
    as soon as the gateway `parent` is."""
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
        """`function(*args)` in a worker; DocumentError (preprocess_failed) if the worker dies."""
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, function, *args)
        except BrokenProcessPool:
            # a worker died (a malformed file crashing a decoder, or the OOM killer): every
            # task of that pool fails; later requests get a fresh pool
            if self._pool is pool:
                log.error("a preprocessing worker died; starting a new pool")  # noqa: TRY400
                self._pool = self._new_pool()
                pool.shutdown(wait=False, cancel_futures=True)
            raise DocumentError(
                "the page could not be read: the worker processing it stopped (the file may be "
                "malformed, or the server is short of memory)",
                "preprocess_failed",
            ) from None

    def close(self) -> None:
        """Stop the workers; pending pages are cancelled."""
        self._pool.shutdown(wait=True, cancel_futures=True)
