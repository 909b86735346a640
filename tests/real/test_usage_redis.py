"""The Redis usage store on a real `redis-server`: replicas add into one total, budgets exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.usage.base import Budget, Counts, Refusal
from app.usage.redisdb import RedisUsage
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh real redis-server per test."""
    server = RedisServer(tmp_path, "usage-pass").start()
    yield server
    server.stop()


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[RedisUsage, RedisUsage]]:
    """Two stores on the same Redis, as two gateway replicas hold them."""
    first, second = RedisUsage(redis_server.url), RedisUsage(redis_server.url)
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


async def test_replicas_add_into_one_total(replicas: tuple[RedisUsage, RedisUsage]) -> None:
    """Both replicas' batches land in one total per key and day; the read-out filters keys."""
    first, second = replicas
    await first.add({("a", "2026-12-01"): Counts(1, 2, 30, 4)})
    await second.add({("a", "2026-12-01"): Counts(2, 1, 10, 1), ("b", "2026-12-31"): Counts(1)})
    rows = await second.totals(None, "2026-12-01", "2026-12-31")
    assert [(r.key, r.day, r.counts.values()) for r in rows] == [
        ("a", "2026-12-01", (3, 3, 40, 5)),
        ("b", "2026-12-31", (1, 0, 0, 0)),
    ]
    assert [r.key for r in await first.totals("b", "2026-12-01", "2026-12-31")] == ["b"]
    assert await first.totals("a", "2026-12-02", "2026-12-31") == []


async def test_concurrent_reservations_stop_exactly_at_the_budget(
    replicas: tuple[RedisUsage, RedisUsage],
) -> None:
    """60 one-page reservations at once from two replicas against 20 a day: exactly 20 pass."""
    budget = Budget(pages_per_day=20)
    stores = [*replicas] * 30
    verdicts = await asyncio.gather(*(s.reserve("k", "2026-12-01", 1, budget) for s in stores))
    assert verdicts.count(None) == 20
    assert {v for v in verdicts if v is not None} == {Refusal("day", 20, 20)}
    totals = await replicas[0].totals("k", "2026-12-01", "2026-12-01")
    assert totals[0].counts.pages == 20


async def test_the_month_budget_sums_the_month_and_unreserve_gives_back(
    replicas: tuple[RedisUsage, RedisUsage],
) -> None:
    """The month's pages are summed over its days; pages given back fit again."""
    first, second = replicas
    month = Budget(pages_per_month=5)
    assert await first.reserve("k", "2026-12-01", 3, month) is None
    assert await second.reserve("k", "2026-12-02", 3, month) == Refusal("month", 5, 3)
    await first.unreserve("k", "2026-12-01", 2)
    assert await second.reserve("k", "2026-12-02", 3, month) is None
    assert await second.reserve("k", "2027-01-01", 5, month) is None  # a new month
