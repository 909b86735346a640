"""Page budgets through jobs and batches, on both usage stores (SQLite, and a real redis-server):
a job's pages are reserved at its submission and a batch's lines at its validation, at once
against the key's budget, and what is not answered is given back at the end (docs/limits.md).

FakeVLLM stands in for the engine (it answers every page at once, or hangs after N pages).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import KeyFile, KeyLimits
from app.jobs.runner import Runner
from app.main import create_app
from app.store.sqlite import SqliteStore
from tests.batches.test_api import ENDED, batch_of, jsonl, request_line, until
from tests.conftest import settings_for
from tests.jobs.test_api import until_ended
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.redis_server import RedisServer
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The settings that pick each usage (and job) store: the data dir's SQLite, or Redis."""
    if request.param == "sqlite":
        yield {}
        return
    server = RedisServer(tmp_path, "budget-pass").start()
    try:
        yield {"redis_url": server.url}
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, folder: Path, budget: int, **overrides: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The gateway in front of `fake`; the key's header with `budget` pages a day."""
    path = folder / "keys.json"
    key = KeyFile(path).create("team", KeyLimits(pages_per_day=budget))
    settings = settings_for(
        fake.url, api_keys_file=path, data_dir=folder / "data", preprocess_workers=1, **overrides
    )
    headers = {"authorization": f"Bearer {key}"}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        yield client, headers


async def used(client: httpx.AsyncClient) -> int:
    """The pages the key's day budget shows used."""
    usage = (await client.get("/v1/usage")).json()
    return int(usage["budgets"][0]["used"])


async def until_used(client: httpx.AsyncClient, pages: int) -> int:
    """The day budget's use once it reads `pages` (counts reach the store within a flush)."""
    for _ in range(100):  # the meter flushes once a second
        if (now := await used(client)) == pages:
            break
        await asyncio.sleep(0.1)
    return now


async def submit(client: httpx.AsyncClient, pages: int) -> httpx.Response:
    """A `pages`-page PDF as a job."""
    return await client.post("/v1/ocr/jobs", files={"file": ("doc.pdf", pdf(pages))})


async def test_jobs_past_the_budget_are_refused_at_submission(
    fake: FakeVLLM, tmp_path: Path, store: dict[str, Any]
) -> None:
    """Budget 20 pages a day, six 10-page jobs sent one after another before any has run:
    two are accepted, four are 429 insufficient_quota, and the day reads 20 of 20."""
    fake.delay = 1.0  # no job is done while they are sent (old code counted finished pages)
    async with gateway(fake, tmp_path, 20, **store) as (client, _):
        answers = [await submit(client, 10) for _ in range(6)]
        fake.delay = 0
        assert [a.status_code for a in answers] == [202, 202, 429, 429, 429, 429]
        refused = answers[-1].json()["error"]
        assert refused["code"] == "insufficient_quota"
        assert "used 20 of its 20 pages" in refused["message"]
        for accepted in answers[:2]:
            job = await until_ended(client, accepted.json()["id"])
            assert (job["status"], job["pages_done"]) == ("succeeded", 10)
        assert await until_used(client, 20) == 20
        assert len(fake.bodies) == 20


async def test_a_cancelled_job_gives_back_its_unanswered_pages(
    fake: FakeVLLM, tmp_path: Path, store: dict[str, Any]
) -> None:
    """Budget 10: a 5-page job answered for 2 pages, then cancelled, gives back 3; a job of 8
    then fits (2 + 8), one of 9 would not."""
    fake.hang_after = 2
    async with gateway(fake, tmp_path, 10, job_page_concurrency=1, **store) as (client, _):
        job = (await submit(client, 5)).json()
        assert await until_used(client, 5) == 5  # reserved whole at once
        for _ in range(200):  # pages 1-2 answered, page 3 hangs
            if len(fake.bodies) == 3:
                break
            await asyncio.sleep(0.05)
        assert len(fake.bodies) == 3
        assert (await client.delete(f"/v1/ocr/jobs/{job['id']}")).status_code == 200
        assert await until_used(client, 2) == 2
        fake.hang_after, fake.mode = None, "ok"
        assert (await submit(client, 9)).status_code == 429
        fits = await submit(client, 8)
        assert fits.status_code == 202, fits.text
        assert (await until_ended(client, fits.json()["id"]))["status"] == "succeeded"
        assert await until_used(client, 10) == 10


async def test_a_failed_jobs_pages_are_given_back(
    fake: FakeVLLM, tmp_path: Path, store: dict[str, Any]
) -> None:
    """Every page of a job failing (the engine answers 500): the job fails and its reserved
    pages are all given back."""
    fake.mode = "status"
    async with gateway(fake, tmp_path, 10, **store) as (client, _):
        job = (await submit(client, 4)).json()
        assert (await until_ended(client, job["id"]))["status"] == "failed"
        assert await until_used(client, 0) == 0


@pytest.mark.parametrize("kind", ["job", "batch"])
async def test_work_ending_as_its_gateway_stops_still_gives_back_its_pages(
    kind: str, fake: FakeVLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway stops just after a job (every page failed: 4 reserved, none answered) or a
    batch (4 lines, 2 of them no request) reached its end, its clean-up held on purpose until
    the stop has begun: the clean-up still finishes, so the next gateway on the same data dir
    shows the unanswered pages given back and the input gone."""
    dropping, stopping = asyncio.Event(), asyncio.Event()
    drop_document, close = SqliteStore.drop_document, Runner.close

    async def held_drop(self: SqliteStore, job_id: str) -> None:
        dropping.set()
        await stopping.wait()
        await drop_document(self, job_id)

    async def closing(self: Runner) -> None:
        stopping.set()  # the held clean-up goes on, and the stop cancels the work's task now
        await close(self)

    monkeypatch.setattr(SqliteStore, "drop_document", held_drop)
    monkeypatch.setattr(Runner, "close", closing)
    async with gateway(fake, tmp_path, 10) as (client, headers):
        if kind == "job":
            fake.mode = "status"
            job = (await submit(client, 4)).json()
            seen, ended, left = f"/v1/ocr/jobs/{job['id']}", "failed", 0
        else:
            data = jsonl(request_line("a"), {"custom_id": "b"}, request_line("c"), "{not json")
            batch = await batch_of(client, data)
            seen, ended, left = f"/v1/batches/{batch['id']}", "completed", 2
        await asyncio.wait_for(dropping.wait(), 60)
        assert (await client.get(seen)).json()["status"] == ended
        assert await used(client) == 4  # reserved still: the clean-up is held
    settings = settings_for(
        fake.url, api_keys_file=tmp_path / "keys.json", data_dir=tmp_path / "data",
        preprocess_workers=1,
    )  # fmt: skip
    async with lifespan_client(create_app(settings), headers=headers) as client:
        assert await used(client) == left
    kept = tmp_path / "data" / ("documents" if kind == "job" else "batch-inputs")
    assert list(kept.iterdir()) == []


async def test_batches_past_the_budget_fail_at_validation(
    fake: FakeVLLM, tmp_path: Path, store: dict[str, Any]
) -> None:
    """Budget 20, three 20-line batches created at once: one runs its 20 lines, the other two
    fail at validation with budget_exhausted, and the day reads 20 of 20."""
    lines = jsonl(*(request_line(str(i)) for i in range(20)))
    async with gateway(fake, tmp_path, 20, **store) as (client, _):
        batches = [await batch_of(client, lines) for _ in range(3)]
        ended = [await until(client, batch["id"], ENDED) for batch in batches]
        assert sorted(batch["status"] for batch in ended) == ["completed", "failed", "failed"]
        for batch in ended:
            if batch["status"] == "completed":
                assert batch["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
            else:
                assert [e["code"] for e in batch["errors"]["data"]] == ["budget_exhausted"]
        assert len(fake.bodies) == 20
        assert await until_used(client, 20) == 20


async def test_a_batchs_failed_lines_are_given_back(
    fake: FakeVLLM, tmp_path: Path, store: dict[str, Any]
) -> None:
    """A batch of 4 lines, 2 of them no request (and never sent): it reserves 4, and its end
    gives back the 2 that got no answer."""
    data = jsonl(request_line("a"), {"custom_id": "b"}, request_line("c"), "{not json")
    async with gateway(fake, tmp_path, 10, **store) as (client, _):
        batch = await batch_of(client, data)
        done = await until(client, batch["id"], ENDED)
        assert done["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
        assert await until_used(client, 2) == 2
