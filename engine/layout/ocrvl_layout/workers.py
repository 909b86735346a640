"""The worker processes that decode, resize and post-process pages off the event loop's process
(`--worker-processes`, docs/layout.md): the one process keeps its GIL for HTTP and the forward
pass's kernel launches.

A pool of `forkserver` processes (never plain fork: the service has loaded torch and runs its
threads), each forked from a server that imported only this module and pages.py's side (no
torch: numpy, OpenCV, Pillow), so a worker costs little memory and starts with them imported.
A worker gets a page's data URL and sends back the page at the model's input size and the size
it was sent at (pages.prepare); after the forward pass it gets the page's candidates and sends
back its boxes (pages.finish). An InvalidRequest raised in a worker pickles whole (message,
param, code) and is raised here as it would be in-process. A worker that dies breaks the pool:
it is replaced by a new one and the call retried once; a second death is WorkerLost (500).
The fork server and the workers ignore SIGTERM and SIGINT: a stop sent to the whole process group
ends the service, which ends them (forkserver.py says why the fork server must not end first).
Workers end with the service: it shuts the pool down as it stops, and each worker watches the
service's PID (a pidfd, Linux 5.3 and newer) and exits when the service is gone, so a killed
service leaves no orphan (the fork server and multiprocessing's resource tracker then end too:
they live while a worker does).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import select
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from prometheus_client import Counter

from ocrvl_layout.errors import WorkerLost

log = logging.getLogger("ocrvl_layout")
T = TypeVar("T")
PRELOAD = ["ocrvl_layout.forkserver", "ocrvl_layout.workers", "ocrvl_layout.pages"]


MOST = 8  # the default's cap (docs/layout-speed.md, "Why this many")


def default_processes() -> int:
    """`--worker-processes` unset: the cores this process may run on, at most MOST."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MOST, cores or 1)


_barrier: Any = None  # in a worker: its pool's barrier for `_started` (a worker's own state)


def initialise(service: int, barrier: Any) -> None:
    """In each worker, first: SIGINT and SIGTERM (a terminal's Ctrl-C, or a stop sent to the
    whole process group) are left to the service, which ends its workers as it stops, and a
    thread ends the worker when the process `service` ends."""
    global _barrier  # noqa: PLW0603 (set once per worker process, before its first call)
    _barrier = barrier
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        watched = os.pidfd_open(service)
    except ProcessLookupError:  # the service ended before the worker started
        os._exit(1)
    except (AttributeError, OSError):  # no pidfds here: the pool's shutdown ends the workers
        return
    threading.Thread(target=_end_with, args=(watched,), name="watch-service", daemon=True).start()


def _end_with(watched: int) -> None:
    select.select([watched], [], [])  # readable once the process has ended
    os._exit(1)


def _started() -> int:
    """A worker's PID once every worker of its pool runs this call (a busy pool forks a worker
    for each call it gets, so `Workers.start` forks them all)."""
    _barrier.wait(timeout=300)
    return os.getpid()


class Workers:
    """`processes` worker processes, replaced when one dies."""

    def __init__(self, processes: int, restarts: Counter) -> None:
        self.processes = processes
        self.restarts = restarts
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(PRELOAD)
        self.pool = self._new()

    def _new(self) -> ProcessPoolExecutor:
        barrier = self.context.Barrier(self.processes)
        return ProcessPoolExecutor(
            self.processes, self.context, initializer=initialise, initargs=(os.getpid(), barrier)
        )

    async def start(self) -> list[int]:
        """Fork every worker now (the pool forks one for each call it has no idle worker for, so
        a call that waits for all of them gets them all); their PIDs."""
        return sorted(await asyncio.gather(*(self.call(_started) for _ in range(self.processes))))

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` in a worker; retried once in a new pool if a worker died."""
        for _ in range(2):
            pool = self.pool
            try:
                return await asyncio.wrap_future(pool.submit(function, *args))
            except BrokenProcessPool:
                self._replace(pool)
        raise WorkerLost(
            f"a worker process died twice running {function.__name__} (the pool was replaced "
            "each time); retry the request, and report the page if it fails again"
        )

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool for one a dead worker broke (once, however many calls learn it)."""
        if self.pool is not broken:
            return
        log.warning("a worker process died: its pool of %d is replaced", self.processes)
        broken.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new()
        self.restarts.inc()

    async def close(self) -> None:
        """End every worker and wait for them."""
        await asyncio.to_thread(self.pool.shutdown, wait=True, cancel_futures=True)
