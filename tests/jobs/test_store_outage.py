"""A job store outage in the middle of a job's pages pauses the job; it never fails it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.store.base import PageRecord, StoreUnavailable
from app.store.sqlite import SqliteStore
from tests.jobs.test_api import gateway, submit, until_ended
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM

pytestmark = pytest.mark.anyio


async def test_a_store_outage_while_keeping_a_page_pauses_the_job(
    fake: FakeVLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first page the runner keeps meets the store down (injected: a fault no real SQLite
    gives on demand, the one `bench.soak` met with Redis restarted mid-job); the job is
    resumed once the lease ends and succeeds with every page, instead of ending `failed`."""
    real = SqliteStore.add_page
    outages = []

    async def once_down(self: SqliteStore, job_id: str, page: PageRecord) -> Any:
        if not outages:
            outages.append(page.number)
            raise StoreUnavailable("an outage injected by the test")
        return await real(self, job_id, page)

    monkeypatch.setattr(SqliteStore, "add_page", once_down)
    async with gateway(fake, tmp_path / "data", job_lease=1.0) as client:
        job = (await submit(client, pdf(2))).json()
        ended = await until_ended(client, job["id"])
    assert outages, "the outage was not met"
    assert (ended["status"], ended["pages_done"], ended["pages_failed"]) == ("succeeded", 2, 0)
