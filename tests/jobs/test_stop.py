"""A gateway told to stop (SIGTERM, Ctrl-C) hands its running jobs back as the stop begins, in
front of FakeVLLM (to hang a page on demand and see it aborted): no page kept as failed, the
lease given up, and the next gateway on the data dir reads the rest. The same against the real
engine, layout service and signals: tests/real/test_stop_jobs.py."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.main import create_app
from app.stopping import Stop
from tests.conftest import CLIENT_KEY, settings_for
from tests.jobs.test_api import submit, until_ended
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, data: Path, stop: Stop | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`, its job store in `data`, one page at a time."""
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=data, job_page_concurrency=1)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    app = create_app(settings, stop=stop)
    async with lifespan_client(app, headers=headers, timeout=60) as client:
        yield client


def lease_until(data: Path, job_id: str) -> float:
    """The job's lease as the SQLite store keeps it (0: given up)."""
    with sqlite3.connect(data / "jobs.sqlite3") as db:
        row = db.execute("SELECT lease_until FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return float(row[0])


async def test_a_stop_hands_the_running_job_back_and_the_next_gateway_ends_it(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Page 1 answered, page 2 hanging on the engine: the stop begins, and at once (the gateway
    still up, draining) page 2 is aborted upstream, the job is still running with no page
    failed and no holder; the next gateway on the data dir reads pages 2 and 3, each once."""
    fake.hang_after = 1
    data, stop = tmp_path / "data", Stop()
    async with gateway(fake, data, stop) as client:
        job_id = (await submit(client, pdf(3))).json()["id"]
        for _ in range(100):
            if len(fake.bodies) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(fake.bodies) == 2
        stop.begin()
        assert await asyncio.to_thread(fake.disconnected.wait, 10)
        deadline = time.monotonic() + 30  # generous: the lease goes once the page's task ends
        while await asyncio.to_thread(lease_until, data, job_id) != 0:
            assert time.monotonic() < deadline, "the stopping gateway never gave the lease up"
            await asyncio.sleep(0.05)
        status = (await client.get(f"/v1/ocr/jobs/{job_id}")).json()
        assert (status["status"], status["pages_done"], status["pages_failed"]) == (
            "running", 1, 0
        )  # fmt: skip
    fake.hang_after, fake.mode = None, "ok"
    async with gateway(fake, data) as client:
        ended = await until_ended(client, job_id)
        assert (ended["status"], ended["pages_done"], ended["pages_failed"]) == (
            "succeeded", 3, 0
        )  # fmt: skip
        result = (await client.get(f"/v1/ocr/jobs/{job_id}/result")).json()
        assert [page["index"] for page in result["pages"]] == [1, 2, 3]
        assert all("error" not in page for page in result["pages"])
