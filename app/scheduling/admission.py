"""The Scheduler: a backend slot now, a fair wait for one, or a fast 503.

A request takes a slot on a backend and holds it until its answer is fully sent. A slot
weighs the request's work (`units`: a page is PAGE_UNITS, a layout block its visual tokens,
docs/admission.md): a backend takes requests while the work it has in flight is under its
`capacity` pages and its sequences under the engine's own limit. When every backend serving
its model is full, it waits in the admission queue (bounded by OCRVL_QUEUE_SIZE and
OCRVL_QUEUE_TIMEOUT); each freed slot goes to the next waiter in fair order across keys. What
cannot wait is shed with 503 `server_overloaded` at once, without calling a backend.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from app.backends import Backend, BackendPool, describe
from app.engines import parse_metrics
from app.errors import Overloaded
from app.metrics import Metrics
from app.scheduling import capacity
from app.scheduling.capacity import PAGE, PAGE_UNITS, Work
from app.scheduling.queue import BACKGROUND, FairQueue, Waiter
from app.scheduling.routing import Router
from app.scheduling.service import ServiceTimes

log = logging.getLogger("ocrvl.scheduling")

FALLBACK_RETRY_AFTER = 5  # seconds, before any backend has served a request
MAX_RETRY_AFTER = 120  # the OpenAI SDK ignores longer values
BACKGROUND_SHARE = 0.5
"""Of each backend's slots, the most the background lane (job pages) holds at once: the rest
stay free for interactive pages, which then wait behind no job page at all at moderate load."""


@dataclass(slots=True, eq=False)
class Lease:
    """A slot on `backend`; `release()` (idempotent) hands it to the next waiter."""

    backend: Backend
    _scheduler: Scheduler = field(repr=False)
    released: bool = False
    since: float = field(default_factory=time.monotonic)
    background: bool = False  # a job page's slot (the background lane)
    work: Work = PAGE

    def release(self) -> None:
        """Give the slot back."""
        if not self.released:
            self.released = True
            held = time.monotonic() - self.since
            self._scheduler.release(
                self.backend, held=held, background=self.background, work=self.work
            )


class Scheduler:
    """Admission and routing over the pool's backends."""

    def __init__(
        self,
        pool: BackendPool,
        metrics: Metrics,
        *,
        enabled: bool,
        queue_size: int,
        queue_timeout: float,
    ) -> None:
        self.pool = pool
        self.enabled = enabled
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self.queue = FairQueue()
        self._metrics = metrics
        self._router = Router()
        self.service = ServiceTimes()
        self._work: dict[str, int] = {}  # units in flight, by backend URL
        self._background: dict[str, int] = {}  # job pages' units in flight, by backend URL
        self._last_done = -math.inf  # when a slot was last given back (time.monotonic())

    # ------------------------------------------------------------------------------ capacity

    def capacity(self, backend: Backend) -> int:
        """Pages `backend` serves at once: its override, else what its engine says."""
        return backend.capacity or capacity.learnt(backend.engine)

    def _serving(self, model: str, exclude: frozenset[str]) -> list[Backend]:
        return [b for b in self.pool.healthy() if model in b.models and b.url not in exclude]

    def sequences(self, backend: Backend) -> int:
        """Sequences `backend` decodes at once: the engine's max-num-seqs where it says, else
        the 256 every profile stays within (never below its capacity in pages)."""
        engine = backend.engine.max_num_seqs if backend.engine is not None else None
        return max(self.capacity(backend), engine or capacity.DEFAULT_CAPACITY)

    def work(self, backend: Backend) -> int:
        """Units of work the gateway has on `backend` now."""
        return self._work.get(backend.url, 0)

    def _least_loaded(self, backends: list[Backend]) -> Backend:
        return self._router.rank(backends, {b.url: self.capacity(b) for b in backends})[0]

    def _has_room(self, backend: Backend) -> bool:
        """Work in flight under the capacity (one more request fits, whatever its weight),
        and sequences under the engine's limit."""
        work_room = self.work(backend) < self.capacity(backend) * PAGE_UNITS
        return work_room and backend.in_flight < self.sequences(backend)

    def _free(self, serving: list[Backend], background: bool = False) -> Backend | None:
        """The least loaded of `serving` with room (any of them, admission off); for the
        background lane, only below its BACKGROUND_SHARE of a backend's capacity."""
        free = [b for b in serving if not self.enabled or self._has_room(b)]
        if background and self.enabled:
            free = [b for b in free if self._background.get(b.url, 0) < self._share(b)]
        return self._least_loaded(free) if free else None

    def _share(self, backend: Backend) -> int:
        return max(int(self.capacity(backend) * BACKGROUND_SHARE), 1) * PAGE_UNITS

    # ----------------------------------------------------------------------------- admission

    async def acquire(
        self, model: str, key: str, exclude: frozenset[str] = frozenset(), work: Work = PAGE
    ) -> Lease | None:
        """A slot for `work` on a backend serving `model`, waiting in the fair queue if all
        are full.

        None when no healthy backend outside `exclude` serves `model` (the caller says why);
        `Overloaded` when the request can not wait. Cancelling the caller (client gone,
        deadline) takes it out of the queue at once.
        """
        serving = self._serving(model, exclude)
        if not serving:
            return None
        background = BACKGROUND.get()
        # Waiters come first: a new request takes a free slot only when none is queued.
        free = self._free(serving, background) if not self.queue or not self.enabled else None
        if free is not None:
            return self._grant(free, background, work)
        return await self._wait(Waiter(key, model, work=work))

    def _take(self, backend: Backend, background: bool, work: Work) -> None:
        backend.in_flight += work.seqs
        self._work[backend.url] = self.work(backend) + work.units
        if background:
            self._background[backend.url] = self._background.get(backend.url, 0) + work.units

    def _grant(self, backend: Backend, background: bool, work: Work) -> Lease:
        self._take(backend, background, work)
        return Lease(backend, self, background=background, work=work)

    async def _wait(self, waiter: Waiter) -> Lease:
        if len(self.queue) >= self.queue_size:
            raise self._shed(
                "queue_full",
                f"every backend is at capacity and the admission queue is full "
                f"({self.queue_size} waiting, OCRVL_QUEUE_SIZE)",
                waiter.model,
            )
        ahead = self.queue.ahead_of(waiter.key)
        expected = self._expected_wait(ahead + 1, waiter.model)
        if expected is not None and expected > self.queue_timeout:
            raise self._shed(
                "expected_wait",
                f"every backend is at capacity and the {ahead} requests queued ahead would "
                f"take about {expected:.0f} s, more than OCRVL_QUEUE_TIMEOUT "
                f"({self.queue_timeout:g} s)",
                waiter.model,
            )
        self.queue.push(waiter)
        self._metrics.queue_depth.set(len(self.queue))
        self.dispatch()  # a slot may be free: only job pages, held to their share, were queued
        try:
            async with asyncio.timeout(self.queue_timeout):
                granted = await waiter.granted
        except TimeoutError:
            raise self._shed(
                "queue_timeout",
                f"every backend stayed at capacity for {self.queue_timeout:g} s "
                "(OCRVL_QUEUE_TIMEOUT) while this request waited",
                waiter.model,
            ) from None
        except asyncio.CancelledError:
            # Gone while waiting (client disconnect, deadline): a slot granted meanwhile
            # goes straight to the next waiter.
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(
                    waiter.granted.result(), background=waiter.background, work=waiter.work
                )
            raise
        finally:
            self.queue.remove(waiter)
            self._metrics.queue_depth.set(len(self.queue))
            self._metrics.queue_wait.observe(time.monotonic() - waiter.since)
        return Lease(granted, self, background=waiter.background, work=waiter.work)

    def release(
        self,
        backend: Backend,
        held: float | None = None,
        *,
        background: bool = False,
        work: Work = PAGE,
    ) -> None:
        """A request on `backend` ended after holding its slot `held` seconds (None: a slot
        reserved for a waiter that left): note it, then hand free slots to waiters. Its
        service time counts in page-seconds (held x its units / PAGE_UNITS), so the drain
        rate (capacity over mean service time) stays in requests per second for any mix."""
        backend.in_flight -= work.seqs
        self._work[backend.url] = self.work(backend) - work.units
        if background:
            self._background[backend.url] -= work.units
        self._last_done = time.monotonic()
        if held is not None:
            self.service.record(backend, held * work.units / PAGE_UNITS)
        self.dispatch()

    def dispatch(self) -> None:
        """Grant free slots to waiters in fair order (after a release, a probe, a scrape)."""
        while self.queue:
            served = self.queue.pop_first(
                lambda waiter: (
                    None
                    if waiter.granted.done()
                    else self._free(self._serving(waiter.model, frozenset()), waiter.background)
                )
            )
            if served is None:
                return
            waiter, backend = served
            self._take(backend, waiter.background, waiter.work)  # reserved now: it resumes later
            waiter.granted.set_result(backend)

    def busy(self, since: float) -> bool:
        """Whether any request holds a slot or waits for one, or gave one back after `since`
        (a `time.monotonic()` reading)."""
        return (
            bool(self.queue)
            or any(b.in_flight for b in self.pool.backends)
            or self._last_done > since
        )

    def readings(self) -> Iterator[tuple[str, dict[str, float]]]:
        """Per-backend load and capacity, for the `ocrvl_backend_*` gauges."""
        for backend in self.pool.backends:
            engine = backend.engine
            yield (
                backend.url,
                {
                    "in_flight": backend.in_flight,
                    "capacity": self.capacity(backend),
                    "sequences": self.sequences(backend),
                    "healthy": float(backend.healthy),
                    "engine_running": engine.running if engine else -1,
                    "engine_waiting": engine.waiting if engine else -1,
                    "engine_kv_usage": engine.kv_usage if engine else -1,
                },
            )

    # --------------------------------------------------------------------------- shedding

    def drain_rate(self, model: str | None = None) -> float | None:
        """Pages per second the healthy backends (those serving `model`, if given) finish
        while full: their capacity over their service time; None before any has served."""
        backends = self.pool.healthy()
        if model is not None:
            backends = [b for b in backends if model in b.models]
        return self.service.drain_rate(backends, self.capacity)

    def _expected_wait(self, position: int, model: str | None = None) -> float | None:
        rate = self.drain_rate(model)
        return None if rate is None else position / rate

    def retry_after(self, model: str | None = None) -> int:
        """Seconds until the queue, draining at the backends' pace, has room for one more."""
        expected = self._expected_wait(len(self.queue) + 1, model)
        if expected is None:
            return FALLBACK_RETRY_AFTER
        return min(max(math.ceil(expected), 1), MAX_RETRY_AFTER)

    def _shed(self, reason: str, message: str, model: str) -> Overloaded:
        self._metrics.shed.labels(reason).inc()
        retry_after = self.retry_after(model)
        return Overloaded(f"{message}; retry after {retry_after} s", retry_after=retry_after)

    # ------------------------------------------------------------------------------ engines

    async def watch(
        self, client: httpx.AsyncClient, headers: dict[str, str], every: float, limit: float
    ) -> None:
        """Each `every` seconds: read every healthy engine's /metrics, re-probe the unhealthy
        ones (a restarted backend is back within a second or two), then hand out free slots."""
        while True:
            await asyncio.sleep(every)
            await asyncio.gather(
                *(self._look(b, client, headers, limit) for b in self.pool.backends)
            )
            self.dispatch()

    async def _look(
        self, backend: Backend, client: httpx.AsyncClient, headers: dict[str, str], limit: float
    ) -> None:
        if not backend.healthy:
            await self.pool.probe(backend)
            return
        try:
            response = await client.get(f"{backend.url}/metrics", headers=headers, timeout=limit)
        except httpx.ConnectError as exc:
            backend.mark_down(f"/metrics: {describe(exc)}")
            return
        except httpx.HTTPError:
            backend.engine = None  # routing falls back to the gateway's in-flight count
            return
        backend.engine = parse_metrics(response.text) if response.status_code == 200 else None
