"""The admission queue's background lane: job pages use only the slots interactive requests
leave free, and an interactive request never waits behind queued job pages."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from app.backends import BackendPool
from app.scheduling import Lease
from app.scheduling.queue import BACKGROUND
from tests.scheduling.conftest import MODEL, backend, scheduler_for

pytestmark = pytest.mark.anyio


async def settle() -> None:
    """Let every ready task run."""
    for _ in range(5):
        await asyncio.sleep(0)


def in_background(coroutine: object) -> asyncio.Task[Lease | None]:
    """`coroutine` as a task whose requests take the background lane."""
    context = contextvars.copy_context()
    context.run(BACKGROUND.set, True)
    return asyncio.create_task(coroutine, context=context)  # type: ignore[arg-type]


async def test_a_freed_slot_goes_to_an_interactive_waiter_before_queued_job_pages(
    pool: BackendPool,
) -> None:
    """Twenty job pages queue first, then one chat request: the next freed slot is the chat's;
    job pages get slots only once no interactive request waits."""
    pool.backends = [backend("http://a", capacity=2)]
    scheduler = scheduler_for(pool)
    held = [await scheduler.acquire(MODEL, "job-key"), await scheduler.acquire(MODEL, "job-key")]
    pages = [in_background(scheduler.acquire(MODEL, "job-key")) for _ in range(20)]
    await settle()
    assert scheduler.queue.background_waiting() == 20
    chat = asyncio.create_task(scheduler.acquire(MODEL, "chat-key"))
    await settle()
    lease = held.pop()
    assert lease is not None
    lease.release()
    await settle()
    assert chat.done(), "the chat request waited behind queued job pages"
    assert not any(page.done() for page in pages)
    chat_lease = chat.result()
    assert chat_lease is not None
    chat_lease.release()
    await settle()
    assert sum(page.done() for page in pages) == 1  # no interactive waiter: a job page
    assert scheduler.queue.background_waiting() == 19
    for page in pages:
        page.cancel()
    await settle()
    assert len(scheduler.queue) == 0


async def test_an_interactive_request_counts_no_job_page_ahead_of_it(pool: BackendPool) -> None:
    """The expected-wait estimate of a chat request leaves the background lane out; a job
    page's counts every interactive waiter."""
    pool.backends = [backend("http://a", capacity=1)]
    scheduler = scheduler_for(pool)
    assert await scheduler.acquire(MODEL, "job-key") is not None
    pages = [in_background(scheduler.acquire(MODEL, "job-key")) for _ in range(30)]
    chats = [asyncio.create_task(scheduler.acquire(MODEL, f"chat-{i}")) for i in range(3)]
    await settle()
    assert scheduler.queue.ahead_of("chat-new") == 3
    context = contextvars.copy_context()
    context.run(BACKGROUND.set, True)
    assert context.run(scheduler.queue.ahead_of, "job-key") == 30 + 3
    for task in (*pages, *chats):
        task.cancel()
    await settle()


async def test_job_pages_hold_at_most_half_of_a_backends_slots(pool: BackendPool) -> None:
    """Ten job pages on a backend of 4 slots: two run, the rest wait, and the two free slots
    go at once to interactive requests (which queue behind no job page)."""
    pool.backends = [backend("http://a", capacity=4)]
    scheduler = scheduler_for(pool)
    pages = [in_background(scheduler.acquire(MODEL, "job-key")) for _ in range(10)]
    await settle()
    assert sum(page.done() for page in pages) == 2
    assert scheduler.queue.background_waiting() == 8
    chats = [asyncio.create_task(scheduler.acquire(MODEL, f"chat-{i}")) for i in range(2)]
    await settle()
    assert all(chat.done() for chat in chats), "a chat waited although a slot was free"
    assert pool.backends[0].in_flight == 4
    running = [page.result() for page in pages if page.done()]
    first = running[0]
    assert first is not None
    first.release()  # a job page ends: the next job page takes its place, within the share
    await settle()
    assert sum(page.done() for page in pages) == 3
    assert scheduler.queue.background_waiting() == 7
    for task in (*pages, *chats):
        if task.done():
            lease = task.result()
            if lease is not None:
                lease.release()
        else:
            task.cancel()
    await settle()
    assert pool.backends[0].in_flight == 0
