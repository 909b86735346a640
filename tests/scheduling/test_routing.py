"""Routing and capacity: the least loaded backend relative to its capacity; capacity learnt."""

from __future__ import annotations

import time

import pytest

from app.backends import BackendPool
from app.engines import EngineLoad
from app.scheduling import capacity
from app.scheduling.routing import Router
from tests.scheduling.conftest import MODEL, backend, scheduler_for

pytestmark = pytest.mark.anyio


def engine(running: int, waiting: int = 0, kv: float = 0.0, age: float = 0.0) -> EngineLoad:
    """An engine reading taken `age` seconds ago."""
    return EngineLoad(running, waiting, kv, None, None, None, time.monotonic() - age)


def test_the_engines_own_load_counts_when_larger_than_the_gateways() -> None:
    """A backend another gateway keeps busy (engine: 8 running) loses to an idle one."""
    busy_elsewhere = backend("http://a", capacity=10, engine=engine(8))
    idle = backend("http://b", capacity=10, in_flight=1, engine=engine(1))
    ranked = Router().rank([busy_elsewhere, idle], {"http://a": 10, "http://b": 10})
    assert [b.url for b in ranked] == ["http://b", "http://a"]


def test_load_is_relative_to_capacity() -> None:
    """Four in flight on a backend of 64 is less loaded than two on a backend of 4."""
    big = backend("http://big", capacity=64, in_flight=4)
    small = backend("http://small", capacity=4, in_flight=2)
    ranked = Router().rank([small, big], {"http://big": 64, "http://small": 4})
    assert ranked[0].url == "http://big"


def test_a_stale_or_missing_reading_falls_back_to_in_flight() -> None:
    """An engine reading from 10 s ago is ignored; so is a backend whose /metrics fails."""
    stale = backend("http://a", capacity=10, in_flight=1, engine=engine(9, age=10))
    unread = backend("http://b", capacity=10, in_flight=2)
    ranked = Router().rank([unread, stale], {"http://a": 10, "http://b": 10})
    assert ranked[0].url == "http://a"


def test_kv_cache_use_breaks_ties() -> None:
    """Equal load: the backend with the emptier KV cache wins."""
    full = backend("http://a", capacity=10, engine=engine(2, kv=0.9))
    empty = backend("http://b", capacity=10, engine=engine(2, kv=0.1))
    for _ in range(3):
        ranked = Router().rank([full, empty], {"http://a": 10, "http://b": 10})
        assert ranked[0].url == "http://b"


def test_equal_backends_take_turns() -> None:
    """Ties rotate, so idle backends share the work."""
    router = Router()
    pair = [backend("http://a", capacity=4), backend("http://b", capacity=4)]
    firsts = {router.rank(pair, {"http://a": 4, "http://b": 4})[0].url for _ in range(4)}
    assert firsts == {"http://a", "http://b"}


def test_capacity_is_learnt_from_the_kv_cache() -> None:
    """8,192 blocks of 16 tokens hold 56 typical pages of 2,316 tokens (145 blocks each)."""
    load = EngineLoad(0, 0, 0.0, 8192, 16, None, 0.0)
    assert capacity.PAGE_TOKENS == 2316
    assert capacity.learnt(load) == 8192 // 145
    assert capacity.learnt(EngineLoad(0, 0, 0.0, 8192, 16, 32, 0.0)) == 32  # max-num-seqs
    big = EngineLoad(0, 0, 0.0, 473_183, 16, None, 0.0)  # an H200's 7.5 M tokens
    assert capacity.learnt(big) == capacity.DEFAULT_CAPACITY
    assert capacity.learnt(None) == capacity.DEFAULT_CAPACITY


async def test_an_operators_capacity_overrides_the_learnt_one(pool: BackendPool) -> None:
    """`;capacity=N` on the backend wins over what the engine says."""
    pool.backends = [backend("http://a", capacity=3, engine=engine(0))]
    scheduler = scheduler_for(pool)
    assert scheduler.capacity(pool.backends[0]) == 3
    pool.backends[0].capacity = None
    assert scheduler.capacity(pool.backends[0]) == capacity.DEFAULT_CAPACITY
    leases = [await scheduler.acquire(MODEL, "k") for _ in range(3)]
    assert all(leases)
