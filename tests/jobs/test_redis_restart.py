"""A Redis restart costs the stores no call: the pool's sockets Redis closed are replaced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.store import Job, new_job_id
from app.store.redisdb import RedisStore
from app.store.redisfiles import RedisFiles
from app.usage.redisdb import RedisUsage
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio
POOLED = 12  # connections the pool holds before the restart (calls in flight at once)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of this test's own (it is restarted)."""
    server = RedisServer(tmp_path, "restart-test-password").start()
    yield server
    server.stop()


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    """The job store on that Redis, opened."""
    opened = RedisStore(redis_server.url)
    await opened.open()
    yield opened
    await opened.close()


def restart(server: RedisServer) -> None:
    """SIGTERM and start again on the same port: every pooled socket is now closed by Redis."""
    server.stop()
    server.start()


async def test_every_job_store_call_after_a_redis_restart_is_answered(
    store: RedisStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    """With POOLED connections in the pool when Redis restarts, the next POOLED calls (each
    meeting one socket Redis closed) are all answered; before the fix each was a 503
    (StoreUnavailable: 'Connection closed by server'), the soak's two job 503s minutes after
    its Redis restart."""
    await asyncio.gather(*(store.get(new_job_id()) for _ in range(POOLED)))
    restart(redis_server)
    for _ in range(POOLED):
        assert await store.get(new_job_id()) is None
    document = tmp_path / "spool"
    document.write_bytes(b"%PDF-")
    job = Job(new_job_id(), "team-a", {"pages": [0], "task": "ocr"}, 1, 5, time.time())
    await asyncio.gather(*(store.get(new_job_id()) for _ in range(POOLED)))
    restart(redis_server)
    await store.create(job, document)  # a transaction (MULTI/EXEC) on a closed socket
    kept = await store.get(job.id)
    assert kept is not None
    assert kept.owner == "team-a"


async def test_the_file_and_usage_stores_survive_a_redis_restart_too(
    redis_server: RedisServer,
) -> None:
    """The batch file store and the usage store use the same client: after a restart with
    pooled sockets, their calls are answered (no StoreUnavailable, no unwritten totals)."""
    files, usage = RedisFiles(redis_server.url), RedisUsage(redis_server.url)
    await files.open()
    await usage.open()
    try:
        await asyncio.gather(*(files.get(f"file-{n}") for n in range(POOLED)))
        await asyncio.gather(
            *(usage.totals("k", "2026-12-01", "2026-12-02") for _ in range(POOLED))
        )
        restart(redis_server)
        for n in range(POOLED):
            assert await files.get(f"file-{n}") is None
            assert await usage.totals("k", "2026-12-01", "2026-12-02") == []
    finally:
        await files.close()
        await usage.close()
