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
import contextlib
import functools
import logging
import multiprocessing
import os
import select
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from app import scratch
from app.documents import raster
from app.documents.errors import DocumentError
from app.documents.selection import PageSelection

log = logging.getLogger("ocrvl.documents")
WORKER_NICENESS = 10
PARENT_POLL = 1.0  # seconds between looks at the parent where there is no pidfd
ATTEMPTS = 3  # tries of a task whose worker dies before it is reported as the file's fault
CLOSE_GRACE = 1.0  # seconds a worker's page may still take once the pool closes; then killed
KILL_WAIT = 1.0  # seconds to wait for a killed worker (or the pool's thread) to be gone
HELD_BYTES = 128 * 1024 * 1024  # OCRVL_PREPROCESS_HELD_BYTES's default


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


class Held:
    """A page's pixels kept in a file for the gateway, and their one owner: whoever `take`s
    them owns them next; the owner lets them go (`close`, or a `with` block): the file deleted,
    its bytes no longer counted. `url`: the page's JPEG data URL of those pixels, when one was
    made already (the layout service is sent that very JPEG, not one encoded again)."""

    __slots__ = ("_free", "pixels", "url")

    def __init__(
        self,
        pixels: raster.Pixels | None = None,
        free: Callable[[], None] | None = None,
        url: str | None = None,
    ) -> None:
        self.pixels, self._free, self.url = pixels, free, url

    def take(self) -> Held:
        """The pixels, now the taker's to close (none left here)."""
        taken = Held(self.pixels, self._free, self.url)
        self.pixels, self._free, self.url = None, None, None
        return taken

    def close(self) -> None:
        """Let the pixels go (nothing when taken or none)."""
        if self._free is not None:
            self._free()
        self.pixels, self._free, self.url = None, None, None

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Preprocessor:
    """Runs `raster` functions in worker processes; a crashed pool is replaced, not fatal.

    It also holds laid-out pages' pixels between their worker calls (from the rasterising to
    the cutting of the blocks, `keeping`), in files of a folder of its own, at most
    `held_bytes` of them (all documents together): a page past it is rasterised again for its
    blocks. A file goes when its owner closes its `Held`, and the folder on `close`.
    """

    def __init__(self, workers: int, held_bytes: int = HELD_BYTES) -> None:
        self.workers = workers
        self.held_bytes = held_bytes
        self.held = 0  # bytes of pixels held now
        self.folder = scratch.folder("pixels")  # the lifespan swept the ones left behind
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

    async def keeping(self, function: Any, *args: Any) -> tuple[Any, Held]:
        """`function(*args, keep)` in a worker, which returns (what it made, the page's pixels
        kept under `keep` or None): what it made, and the pixels held."""
        keep = raster.Keep(self.folder, max(self.held_bytes - self.held, 0))
        task = asyncio.ensure_future(self.run(function, *args, keep))
        try:
            made, pixels = await asyncio.shield(task)
        except asyncio.CancelledError:  # the worker goes on: what it keeps is for nobody
            task.add_done_callback(_discard)
            raise
        return made, self._hold(pixels)

    def _hold(self, pixels: raster.Pixels | None) -> Held:
        """`pixels` counted until their owner lets them go; past `held_bytes`, none."""
        if pixels is None:
            return Held()
        if self.held + pixels.size > self.held_bytes:  # others were held meanwhile
            _delete(pixels.path)
            return Held()
        self.held += pixels.size
        return Held(pixels, functools.partial(self._freed, pixels.path, pixels.size))

    def _freed(self, path: str, size: int) -> None:
        _delete(path)
        self.held -= size

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
        """Stop the workers: pending pages are cancelled, held pixels deleted, and a worker still
        busy after `grace` seconds is killed. By then the requests have drained and the jobs
        were handed back, so its page is one nobody waits for; `shutdown(wait=True)` waited for
        it, for ever if it never ended (a page that never renders), and the gateway's stop with
        it."""
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
        shutil.rmtree(self.folder, ignore_errors=True)


def _discard(task: asyncio.Future[Any]) -> None:
    """The file a worker kept for a page whose reading was cancelled meanwhile."""
    if not task.cancelled() and task.exception() is None and task.result()[1] is not None:
        _delete(task.result()[1].path)


def _delete(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # the folder went with the pool
        os.unlink(path)
