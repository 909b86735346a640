"""Both job stores (SQLite in a data dir, a real redis-server) behave alike."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from app.store import Job, Store, new_job_id
from app.store.base import CANCELLED, PageRecord
from app.store.redisdb import RedisStore
from app.store.sqlite import SqliteStore
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the module."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), "store-test-password").start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[Store]:
    """An opened store of each kind (Redis flushed first)."""
    opened: Store
    if request.param == "sqlite":
        opened = SqliteStore(tmp_path / "data")
    else:
        opened = RedisStore(redis_server.url)
        await opened._redis.flushdb()
    await opened.open()
    yield opened
    await opened.close()


def a_job(owner: str = "team-a", pages: int = 3, created: float | None = None) -> Job:
    """A queued job of `pages` pages."""
    spec = {"pages": list(range(pages)), "task": "ocr"}
    return Job(new_job_id(), owner, spec, pages, 5, created or time.time())


async def created(store: Store, tmp_path: Path, job: Job) -> Job:
    """`job` kept, with a five-byte document."""
    document = tmp_path / f"spool-{job.id}"
    document.write_bytes(b"%PDF-")
    await store.create(job, document)
    assert not document.exists()  # consumed
    return job


async def test_a_job_round_trips_with_its_document(store: Store, tmp_path: Path) -> None:
    """What was created comes back field for field; the document is readable; bytes counted."""
    job = await created(store, tmp_path, a_job())
    assert await store.get(job.id) == job
    assert await store.get(new_job_id()) is None
    path = await store.document(job.id, tmp_path)
    assert path is not None
    assert path.read_bytes() == b"%PDF-"
    assert await store.stored_bytes() == 5
    await store.drop_document(job.id)
    assert await store.document(job.id, tmp_path) is None
    assert await store.stored_bytes() == 0


async def test_a_claimed_job_is_leased_to_one_holder(store: Store, tmp_path: Path) -> None:
    """The oldest job goes to the first claimer; nobody else gets it until its lease ends."""
    now = time.time()
    old = await created(store, tmp_path, a_job(created=now - 10))
    await created(store, tmp_path, a_job(created=now))
    first = await store.claim("gw-1", now, 30)
    assert first is not None
    assert (first.id, first.status, first.holder) == (old.id, "running", "gw-1")
    assert first.started_at == pytest.approx(now)
    second = await store.claim("gw-2", now, 600)
    assert second is not None
    assert second.id != old.id
    assert await store.claim("gw-3", now, 30) is None
    assert await store.renew(old.id, "gw-1", now + 60)
    assert not await store.renew(old.id, "gw-2", now + 60)
    # gw-1 dies: after its lease (now + 60) another gateway takes the job over
    assert await store.claim("gw-3", now + 59, 30) is None
    taken = await store.claim("gw-3", now + 61, 30)
    assert taken is not None
    assert (taken.id, taken.holder, taken.started_at) == (old.id, "gw-3", first.started_at)
    assert not await store.renew(old.id, "gw-1", now + 90)


async def test_a_page_is_kept_and_counted_once(store: Store, tmp_path: Path) -> None:
    """The same page written twice (two gateways racing) is one page; counts add up once;
    a job that is not running takes no pages."""
    job = await created(store, tmp_path, a_job())
    page = PageRecord(2, b'{"index":2}', failed=False, prompt_tokens=7, completion_tokens=3)
    assert not await store.add_page(job.id, page)  # still queued
    await store.claim("gw-1", time.time(), 30)
    assert await store.add_page(job.id, page)
    assert not await store.add_page(job.id, page)
    assert await store.add_page(job.id, PageRecord(1, b'{"index":1}', failed=True))
    kept = await store.get(job.id)
    assert kept is not None
    assert (kept.pages_done, kept.pages_failed) == (2, 1)
    assert kept.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert await store.pages(job.id) == [b'{"index":1}', b'{"index":2}']
    assert await store.page_numbers(job.id) == {1, 2}


async def test_a_transition_is_compare_and_set(store: Store, tmp_path: Path) -> None:
    """A cancelled job cannot then succeed; the active count and the expiry follow."""
    job = await created(store, tmp_path, a_job())
    assert await store.active("team-a") == 1
    error = {"message": "cancelled", "type": "x", "param": None, "code": None}
    now = time.time()
    changes = {"finished_at": now, "expires_at": now + 5, "error": error}
    assert await store.transition(job.id, ("queued", "running"), CANCELLED, changes)
    assert not await store.transition(job.id, ("queued", "running"), "succeeded", {})
    kept = await store.get(job.id)
    assert kept is not None
    assert (kept.status, kept.error, kept.expires_at) == (CANCELLED, error, now + 5)
    assert await store.active("team-a") == 0
    assert await store.claim("gw-1", now, 30) is None
    assert [due.id for due in await store.due(now + 6)] == [job.id]
    assert await store.due(now + 4) == []
    await store.delete(job.id)
    assert await store.get(job.id) is None
    assert await store.due(now + 6) == []


async def test_listing_is_per_owner_newest_first_and_paged(store: Store, tmp_path: Path) -> None:
    """Three jobs of one key in pages of two; another key's job never appears."""
    now = time.time()
    mine = [await created(store, tmp_path, a_job(created=now + i)) for i in range(3)]
    await created(store, tmp_path, a_job(owner="team-b"))
    first = await store.listing("team-a", 2, None)
    assert [job.id for job in first] == [mine[2].id, mine[1].id]
    rest = await store.listing("team-a", 2, first[-1].id)
    assert [job.id for job in rest] == [mine[0].id]
    assert orjson.dumps([job.owner for job in first + rest]) == b'["team-a","team-a","team-a"]'


async def test_a_new_sqlite_gateway_takes_over_a_dead_ones_jobs_at_once(tmp_path: Path) -> None:
    """The next store on the same data dir (the lock is free: its holder is gone) makes the
    running job claimable without waiting for the lease."""
    first = SqliteStore(tmp_path / "data")
    await first.open()
    job = await created(first, tmp_path, a_job())
    now = time.time()
    assert await first.claim("gw-dead", now, 600) is not None
    await first.close()  # as the kernel would on kill -9: the lock is dropped
    second = SqliteStore(tmp_path / "data")
    await second.open()
    try:
        taken = await second.claim("gw-new", now + 1, 30)
        assert taken is not None
        assert (taken.id, taken.holder) == (job.id, "gw-new")
    finally:
        await second.close()


@pytest.mark.parametrize("end", ["succeeded", "cancelled"])
async def test_the_sweep_expires_ended_jobs_then_removes_them(
    store: Store, tmp_path: Path, end: str
) -> None:
    """Past its TTL an ended job (a cancelled one too: it kept its finished pages until then)
    loses its pages and document and shows `expired`; one TTL later the record is gone; a
    running job is never swept."""
    from app.jobs.events import JobEvents  # noqa: PLC0415
    from app.jobs.runner import Runner  # noqa: PLC0415
    from app.metrics import Metrics  # noqa: PLC0415
    from tests.conftest import settings_for  # noqa: PLC0415

    now = time.time()
    ended = await created(store, tmp_path, a_job(created=now - 2))
    running = await created(store, tmp_path, a_job(created=now - 1))
    await store.claim("gw-1", now, 600)
    await store.claim("gw-1", now, 600)
    await store.add_page(ended.id, PageRecord(1, b'{"index":1}', failed=False))
    changes = {"finished_at": now, "expires_at": now + 1}
    assert await store.transition(ended.id, ("running",), end, changes)
    assert await store.pages(ended.id) == [b'{"index":1}']
    runner = Runner(
        store, relay=None, preprocessor=None, settings=settings_for("http://x", job_ttl=5),  # type: ignore[arg-type]
        events=JobEvents(Metrics(), lambda: 0), webhooks=None,  # type: ignore[arg-type]
    )  # fmt: skip
    await runner.sweep(now + 2)
    expired = await store.get(ended.id)
    assert expired is not None
    assert (expired.status, expired.expires_at) == ("expired", now + 2 + 5)
    assert await store.pages(ended.id) == []
    assert await store.document(ended.id, tmp_path) is None
    await runner.sweep(now + 8)
    assert await store.get(ended.id) is None
    kept = await store.get(running.id)
    assert kept is not None
    assert kept.status == "running"


async def test_a_batchs_output_is_written_as_it_is_read(store: Store, tmp_path: Path) -> None:
    """4,000 kept lines of 8 KB (32 MB) become the output and error files while tracemalloc
    sees at most a few MB allocated at once: the store gives them a chunk at a time and each
    chunk is written before the next is read (before: every line in one list, 32 MB and more)."""
    from app.batches.lines import output_line  # noqa: PLC0415
    from app.batches.results import write_files  # noqa: PLC0415
    from app.store.files import SqliteFiles  # noqa: PLC0415

    job = await created(store, tmp_path, a_job(pages=4000))
    await store.claim("gw-1", time.time(), 600)
    text = "x" * 8000
    for number in range(1, 4001):
        status = 200 if number % 10 else 400  # every tenth line to the error file
        line = output_line(str(number), status, f"r{number}", {"text": text})
        await store.add_page(job.id, PageRecord(number, line, failed=status != 200))
    files = SqliteFiles(tmp_path / "files")
    await files.open()
    try:
        tracemalloc.start()
        try:
            output, errors = await write_files(
                files, job.id, job.owner, store.page_chunks(job.id), ttl=60
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        lines = []
        for identity in (output, errors):
            assert identity is not None
            lines.append(b"".join([c async for c in files.content(identity)]).count(b"\n"))
        assert lines == [3600, 400]
    finally:
        await files.close()
    assert peak < 8 * 1024 * 1024, f"finalizing allocated {peak / 2**20:.1f} MiB at its peak"
