"""Admission by work: a slot weighs what the request costs (a page, n pages, a layout block's
visual tokens), under the backend's capacity and its engine's sequence limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.backends import BackendPool
from app.engines import EngineLoad
from app.scheduling import PAGE_UNITS, Work
from app.scheduling.queue import BACKGROUND
from tests.scheduling.conftest import MODEL, backend, scheduler_for

pytestmark = pytest.mark.anyio
BLOCK = Work(176)  # a 260 x 20 px text line at min_pixels: 176 visual tokens


async def test_blocks_fill_a_backend_by_their_work_not_their_number(pool: BackendPool) -> None:
    """Capacity 1 page = 1,280 units: 8 blocks of 176 are admitted (the 8th while 7 x 176 =
    1,232 was under it), the 9th waits for one to end."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    leases = [await scheduler.acquire(MODEL, "k", work=BLOCK) for _ in range(8)]
    waiting = asyncio.create_task(scheduler.acquire(MODEL, "k", work=BLOCK))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert (pool.backends[0].in_flight, scheduler.work(pool.backends[0])) == (8, 8 * 176)
    leases[0].release()  # type: ignore[union-attr]
    assert (await waiting) is not None
    assert pool.backends[0].in_flight == 8


async def test_n_sequences_hold_n_pages_until_released(pool: BackendPool) -> None:
    """A request of n = 3 counts 3 sequences and 3 pages of work; its release frees all of
    them (twice is once)."""
    pool.backends = [backend("http://a", capacity=4)]
    scheduler = scheduler_for(pool)
    lease = await scheduler.acquire(MODEL, "k", work=Work(3 * PAGE_UNITS, 3))
    assert lease is not None
    assert (pool.backends[0].in_flight, scheduler.work(pool.backends[0])) == (3, 3 * PAGE_UNITS)
    lease.release()
    lease.release()
    assert (pool.backends[0].in_flight, scheduler.work(pool.backends[0])) == (0, 0)


async def test_the_engines_sequence_limit_caps_small_requests(pool: BackendPool) -> None:
    """The engine's max_num_seqs caps sequences (never below the capacity in pages): with room
    for 2 pages of work and 4 sequences, the fifth small block waits."""

    def seqs(limit: int) -> EngineLoad:
        return EngineLoad(0, 0, 0.0, None, None, limit, time.monotonic())

    pool.backends = [backend("http://a", capacity=10, engine=seqs(4))]
    scheduler = scheduler_for(pool)
    assert scheduler.sequences(pool.backends[0]) == 10  # never below the capacity in pages
    pool.backends[0].engine = seqs(40)
    assert scheduler.sequences(pool.backends[0]) == 40
    pool.backends[0].capacity, pool.backends[0].engine = 2, seqs(4)
    assert scheduler.sequences(pool.backends[0]) == 4
    for _ in range(4):
        assert await scheduler.acquire(MODEL, "k", work=Work(10)) is not None
    fifth = asyncio.create_task(scheduler.acquire(MODEL, "k", work=Work(10)))
    await asyncio.sleep(0)
    assert not fifth.done()
    fifth.cancel()


async def test_job_blocks_hold_at_most_half_of_the_capacity_in_work(pool: BackendPool) -> None:
    """The background lane's half share counts work: capacity 2 pages leaves job blocks 1,280
    units, so 8 blocks of 176 run (7 x 176 = 1,232 under it) and the ninth waits."""
    pool.backends = [backend("http://a", capacity=2)]
    scheduler = scheduler_for(pool)

    async def job_block() -> object:
        BACKGROUND.set(True)
        return await scheduler.acquire(MODEL, "job", work=BLOCK)

    granted = [await asyncio.create_task(job_block()) for _ in range(8)]
    ninth = asyncio.create_task(job_block())
    await asyncio.sleep(0)
    assert all(granted)
    assert not ninth.done()
    assert await scheduler.acquire(MODEL, "chat") is not None  # interactive work still fits
    ninth.cancel()


async def test_service_time_counts_page_seconds(pool: BackendPool) -> None:
    """A block holding its slot 1 s at a tenth of a page's work counts 0.1 page-seconds, so
    the drain rate (capacity over mean service time) stays in requests per second."""
    pool.backends = [backend("http://a", capacity=4)]
    scheduler = scheduler_for(pool)
    scheduler.release(pool.backends[0], 1.0, work=Work(128))
    pool.backends[0].in_flight = 1  # what release took back
    assert scheduler.service.mean(pool.backends[0]) == pytest.approx(0.1)
    assert scheduler.drain_rate() == pytest.approx(40)
