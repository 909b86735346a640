"""The Scheduler: slots up to capacity, a bounded fair queue, fast sheds, cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.backends import BackendPool
from app.errors import Overloaded
from app.scheduling import Scheduler
from tests.scheduling.conftest import MODEL, backend, scheduler_for

pytestmark = pytest.mark.anyio


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_slots_up_to_capacity_then_requests_wait(pool: BackendPool) -> None:
    """A backend of capacity 2 takes two requests at once; the third waits for a release."""
    pool.backends = [backend("http://a", capacity=2)]
    scheduler = scheduler_for(pool)
    first = await scheduler.acquire(MODEL, "k")
    second = await scheduler.acquire(MODEL, "k")
    third = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    await settle()
    assert not third.done()
    assert len(scheduler.queue) == 1
    assert first is not None
    assert second is not None
    first.release()
    lease = await asyncio.wait_for(third, 10)
    assert lease is not None
    assert lease.backend.url == "http://a"
    assert pool.backends[0].in_flight == 2
    assert len(scheduler.queue) == 0


async def test_release_is_idempotent(pool: BackendPool) -> None:
    """Releasing a lease twice frees one slot, not two."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    lease = await scheduler.acquire(MODEL, "k")
    assert lease is not None
    lease.release()
    lease.release()
    assert pool.backends[0].in_flight == 0


async def test_one_keys_flood_does_not_starve_another_key(pool: BackendPool) -> None:
    """Key A queues 50 pages, then key B queues one: B is served after at most one of A's."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    lease = await scheduler.acquire(MODEL, "A")
    floods = [asyncio.create_task(scheduler.acquire(MODEL, "A")) for _ in range(50)]
    await settle()
    single = asyncio.create_task(scheduler.acquire(MODEL, "B"))
    await settle()
    pending = {task: "A" for task in floods} | {single: "B"}
    served: list[str] = []
    for _ in range(4):  # hand the one slot on, release by release, and note who gets it
        assert lease is not None
        lease.release()
        await settle()
        granted = [task for task in pending if task.done()]
        assert len(granted) == 1, "one release hands out exactly one slot"
        served.append(pending.pop(granted[0]))
        lease = granted[0].result()
    assert "B" in served[:2], f"B waited behind more than one of A's pages: {served}"
    assert served.count("A") == 3  # and A goes on being served after B
    for task in pending:
        task.cancel()
    await settle()
    assert len(scheduler.queue) == 0


async def test_full_queue_sheds_at_once_with_retry_after(pool: BackendPool) -> None:
    """With the slot taken and the queue full, the next request is shed without waiting."""
    pool.backends = [backend("http://a", capacity=1)]
    # a queue timeout of a minute: a shed that waited for it would take that long
    scheduler = scheduler_for(pool, queue_size=2, queue_timeout=60.0)
    held = await scheduler.acquire(MODEL, "k")
    waiting = [asyncio.create_task(scheduler.acquire(MODEL, "k")) for _ in range(2)]
    await settle()
    started = time.perf_counter()
    with pytest.raises(Overloaded) as shed:
        await scheduler.acquire(MODEL, "k")
    assert time.perf_counter() - started < 5  # at once: not a 50 ms bound a busy core can miss
    assert shed.value.status == 503
    assert shed.value.code == "server_overloaded"
    assert "OCRVL_QUEUE_SIZE" in shed.value.message
    assert int(shed.value.headers()["retry-after"]) >= 1
    assert held is not None
    for task in waiting:
        task.cancel()


async def test_waiting_too_long_is_shed(pool: BackendPool) -> None:
    """A request still queued after OCRVL_QUEUE_TIMEOUT gets 503 and leaves the queue."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool, queue_timeout=0.2)
    held = await scheduler.acquire(MODEL, "k")
    with pytest.raises(Overloaded, match="OCRVL_QUEUE_TIMEOUT"):
        await scheduler.acquire(MODEL, "k")
    assert len(scheduler.queue) == 0
    assert held is not None


def served(scheduler: Scheduler, seconds: float, times: int = 20) -> None:
    """Note `times` requests on every backend that each held a slot for `seconds`."""
    for b in scheduler.pool.backends:
        for _ in range(times):
            scheduler.service.record(b, seconds)


async def test_retry_after_follows_the_backends_service_time(pool: BackendPool) -> None:
    """A page takes 0.1 s on a backend of capacity 1 and 20 are queued: a shed request is
    told to come back in ~2-3 s (21 ahead at 10 a second)."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool, queue_size=20)
    served(scheduler, 0.1)
    held = await scheduler.acquire(MODEL, "k")
    waiting = [asyncio.create_task(scheduler.acquire(MODEL, "k")) for _ in range(20)]
    await settle()
    with pytest.raises(Overloaded) as shed:
        await scheduler.acquire(MODEL, "k")
    assert 2 <= shed.value.retry_after <= 4
    assert held is not None
    for task in waiting:
        task.cancel()


async def test_expected_wait_beyond_the_timeout_is_shed_at_once(pool: BackendPool) -> None:
    """At 1 s a page on one slot, a request 10 places back with a 5 s timeout is shed now."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool, queue_timeout=5)
    served(scheduler, 1.0)
    held = await scheduler.acquire(MODEL, "k")
    waiting = [asyncio.create_task(scheduler.acquire(MODEL, "k")) for _ in range(9)]
    await settle()
    with pytest.raises(Overloaded, match="would take about"):
        await scheduler.acquire(MODEL, "k")
    assert held is not None
    for task in waiting:
        task.cancel()


async def test_capacity_counts_in_the_expected_wait(pool: BackendPool) -> None:
    """The same 1 s pages on two backends of 8 slots each drain 16 a second: 40 queued with a
    5 s timeout all wait instead of being shed."""
    pool.backends = [backend("http://a", capacity=8), backend("http://b", capacity=8)]
    scheduler = scheduler_for(pool, queue_timeout=5)
    served(scheduler, 1.0)
    held = [await scheduler.acquire(MODEL, "k") for _ in range(16)]
    waiting = [asyncio.create_task(scheduler.acquire(MODEL, "k")) for _ in range(40)]
    await settle()
    assert not any(task.done() for task in waiting), "a drainable burst was shed"
    assert len(scheduler.queue) == 40
    assert 1 <= scheduler.retry_after(MODEL) <= 4  # 41 ahead at 16 a second
    assert all(lease is not None for lease in held)
    for task in waiting:
        task.cancel()
    await settle()


async def serve_for(scheduler: Scheduler, key: str, seconds: float) -> None:
    """One request that holds its slot `seconds`, as a page on a real engine would."""
    lease = await scheduler.acquire(MODEL, key)
    assert lease is not None
    await asyncio.sleep(seconds)
    lease.release()


async def test_a_burst_after_a_quiet_spell_is_served_not_shed(
    pool: BackendPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few pages, then 20 s of silence, then a burst the backends drain in well under the
    queue timeout: every page is served, none shed at once (the H200's immediate 503s: a
    rate of recent completions read one page per 5 s and shed the burst)."""
    pool.backends = [backend("http://a", capacity=4)]
    scheduler = scheduler_for(pool, queue_timeout=5)
    await asyncio.gather(*(serve_for(scheduler, "k", 0.02) for _ in range(4)))
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + 20)  # the quiet spell
    results = await asyncio.gather(
        *(serve_for(scheduler, "k", 0.02) for _ in range(60)), return_exceptions=True
    )
    shed = [r for r in results if isinstance(r, Overloaded)]
    assert not shed, f"{len(shed)} of 60 shed: {shed[0].message}"
    assert all(r is None for r in results)


async def test_before_anything_is_served_only_the_queue_bounds_shed(pool: BackendPool) -> None:
    """A fresh gateway knows no service time: a burst waits (queue size and timeout bound it)
    and nothing is shed on a guess."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool, queue_size=30)
    held = await scheduler.acquire(MODEL, "k")
    waiting = [asyncio.create_task(scheduler.acquire(MODEL, "k")) for _ in range(30)]
    await settle()
    assert not any(task.done() for task in waiting)
    assert scheduler.retry_after(MODEL) == 5  # the fallback, until a page has been served
    with pytest.raises(Overloaded, match="OCRVL_QUEUE_SIZE"):
        await scheduler.acquire(MODEL, "k")
    assert held is not None
    for task in waiting:
        task.cancel()
    await settle()


async def test_a_request_cancelled_while_queued_leaves_and_the_next_one_proceeds(
    pool: BackendPool,
) -> None:
    """The client of a queued request goes: it leaves the queue at once; the freed slot goes
    to the request behind it."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    held = await scheduler.acquire(MODEL, "k")
    gone = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    behind = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    await settle()
    gone.cancel()
    await settle()
    assert len(scheduler.queue) == 1
    assert held is not None
    held.release()
    lease = await asyncio.wait_for(behind, 10)
    assert lease is not None
    assert pool.backends[0].in_flight == 1


async def test_a_slot_granted_to_a_request_cancelled_at_that_moment_is_passed_on(
    pool: BackendPool,
) -> None:
    """Granted and cancelled in the same turn: the slot is not lost, the next waiter gets it."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    held = await scheduler.acquire(MODEL, "k")
    unlucky = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    behind = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    await settle()
    assert held is not None
    held.release()  # grants `unlucky` its slot ...
    unlucky.cancel()  # ... which is cancelled before it runs
    lease = await asyncio.wait_for(behind, 10)
    assert lease is not None
    assert pool.backends[0].in_flight == 1


async def test_admission_off_sends_past_capacity(pool: BackendPool) -> None:
    """OCRVL_ADMISSION=off: nothing waits in the gateway, the engine queues instead."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool, enabled=False)
    leases = [await scheduler.acquire(MODEL, "k") for _ in range(5)]
    assert all(lease is not None for lease in leases)
    assert pool.backends[0].in_flight == 5


async def test_no_backend_serving_the_model_is_none(pool: BackendPool) -> None:
    """Nothing healthy serves the model: None, for the relay to explain (503/502)."""
    sick = backend("http://a")
    sick.healthy = False
    pool.backends = [sick, backend("http://b")]
    scheduler = scheduler_for(pool)
    assert await scheduler.acquire("other-model", "k") is None
    assert await scheduler.acquire(MODEL, "k", frozenset({"http://b"})) is None


async def test_a_waiter_takes_a_slot_on_whichever_backend_frees_one(pool: BackendPool) -> None:
    """Two backends, both full: the queued request goes to the one that frees a slot."""
    pool.backends = [backend("http://a"), backend("http://b")]
    scheduler = scheduler_for(pool)
    first = await scheduler.acquire(MODEL, "k")
    second = await scheduler.acquire(MODEL, "k")
    assert first is not None
    assert second is not None
    assert {first.backend.url, second.backend.url} == {"http://a", "http://b"}
    waiter = asyncio.create_task(scheduler.acquire(MODEL, "k"))
    await settle()
    second.release()
    lease = await asyncio.wait_for(waiter, 10)
    assert lease is not None
    assert lease.backend is second.backend


async def test_busy_while_a_slot_is_held_and_after_one_came_back(pool: BackendPool) -> None:
    """`busy(since)` is true while a request holds a slot and, once it gave it back, for a
    look from before that; a look from after says idle (the allocator trims then)."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    before = time.monotonic()
    assert not scheduler.busy(before)
    lease = await scheduler.acquire(MODEL, "k")
    assert lease is not None
    assert scheduler.busy(time.monotonic())
    lease.release()
    assert scheduler.busy(before)
    assert not scheduler.busy(time.monotonic())
