"""The results cache and Idempotency-Key on a real Redis (issue 51): two gateways share both.

A real `redis-server` (tests/support/redis_server.py), two in-process gateways on it, each with
a data dir of its own; FakeVLLM counts what reaches the backend. Serial: a real part.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.store.redisresults import RedisResults
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.redis_server import RedisServer
from tests.support.servers import lifespan_client

pytestmark = [pytest.mark.anyio, pytest.mark.serial]
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis on a loopback port, stopped by PID after the test."""
    server = RedisServer(tmp_path, "cache-test-password").start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, redis: RedisServer, data_dir: Path, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """One replica: the cache on, the stores in `redis`, its own data dir."""
    settings = settings_for(
        fake.url, redis_url=redis.url, data_dir=data_dir, cache="on", preprocess_workers=1,
        **overrides,
    )  # fmt: skip
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


async def test_two_gateways_on_one_redis_share_the_cache(
    fake: FakeVLLM, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A page read through one replica is a hit on the other: no second backend request."""
    async with (
        gateway(fake, redis_server, tmp_path / "a") as first,
        gateway(fake, redis_server, tmp_path / "b") as second,
    ):
        read = await first.post("/v1/ocr", files={"file": ("d.pdf", pdf(2))})
        again = await second.post("/v1/ocr", files={"file": ("d.pdf", pdf(2))})
    assert (read.headers["x-ocrvl-cache"], again.headers["x-ocrvl-cache"]) == ("miss", "hit")
    assert len(fake.bodies) == 2
    assert [page["text"] for page in again.json()["pages"]] == [
        page["text"] for page in read.json()["pages"]
    ]


async def test_two_gateways_on_one_redis_share_idempotency_keys(
    fake: FakeVLLM, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A job submitted to one replica and again, same key, to the other: one job."""
    document = pdf(2)
    headers = {"idempotency-key": "retry-after-a-lost-answer"}
    async with (
        gateway(fake, redis_server, tmp_path / "a") as first,
        gateway(fake, redis_server, tmp_path / "b") as second,
    ):
        sent = await first.post(
            "/v1/ocr/jobs", files={"file": ("d.pdf", document)}, headers=headers
        )
        again = await second.post(
            "/v1/ocr/jobs", files={"file": ("d.pdf", document)}, headers=headers
        )
        other = await second.post(
            "/v1/ocr/jobs", files={"file": ("d.pdf", pdf(3))}, headers=headers
        )
        listed = (await second.get("/v1/ocr/jobs")).json()["data"]
    assert (sent.status_code, again.status_code, other.status_code) == (202, 202, 422)
    assert again.json()["id"] == sent.json()["id"]
    assert [job["id"] for job in listed] == [sent.json()["id"]]


async def test_the_redis_store_drops_the_oldest_over_its_cap(redis_server: RedisServer) -> None:
    """RedisResults: over the cap the oldest written go first; the size it reports is exact."""
    store = RedisResults(redis_server.url, ttl=100, max_bytes=25)
    await store.open()
    try:
        now = time.time()
        for age, key in ((3, "a"), (2, "b"), (1, "c")):
            await store.put(key, key.encode() * 10, now - age)
        await store.put("b", b"B" * 10, now)  # written again: newest now, counted once
        size = await store.sweep(now)
        assert (size.entries, size.bytes) == (2, 20)
        assert [await store.get(k, now) for k in ("a", "b", "c")] == [None, b"B" * 10, b"c" * 10]
        expired = await store.sweep(now + 200)  # past the TTL: the index follows Redis's EX
        assert (expired.entries, expired.bytes) == (0, 0)
    finally:
        await store.close()
