"""The jobs API in-process, in front of FakeVLLM (to hang pages on demand and see them aborted)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.main import create_app
from app.store import Job
from app.store.sqlite import SqliteStore
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
OTHER_KEY = "sk-test-other-key"


@contextlib.asynccontextmanager
async def gateway(fake: FakeVLLM, data: Path, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`, its job store in `data`; two keys."""
    settings = settings_for(
        fake.url, api_keys=[CLIENT_KEY, OTHER_KEY], preprocess_workers=1, data_dir=data,
        **overrides,
    )  # fmt: skip
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        yield client


async def submit(client: httpx.AsyncClient, data: bytes, **fields: str) -> httpx.Response:
    """POST the file as a job."""
    return await client.post("/v1/ocr/jobs", files={"file": ("doc.pdf", data)}, data=fields)


async def until_ended(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """Long-poll the job until it ends."""
    for _ in range(60):
        response = await client.get(f"/v1/ocr/jobs/{job_id}", params={"wait": "5"})
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        if job["status"] not in ("queued", "running"):
            return job
    raise AssertionError(f"job {job_id} did not end")


async def test_a_job_runs_to_the_same_answer_as_v1_ocr(fake: FakeVLLM, tmp_path: Path) -> None:
    """202 + Location; long-polled to succeeded with every page counted; the result in JSON,
    NDJSON and markdown has /v1/ocr's form for the same file."""
    async with gateway(fake, tmp_path / "data") as client:
        response = await submit(client, pdf(4))
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["id"].startswith("job_")
        assert len(job["id"]) > 20
        assert (job["object"], job["status"], job["pages_total"]) == ("ocr.job", "queued", 4)
        assert response.headers["location"] == f"/v1/ocr/jobs/{job['id']}"
        ended = await until_ended(client, job["id"])
        assert (ended["status"], ended["pages_done"], ended["pages_failed"]) == ("succeeded", 4, 0)
        assert ended["usage"] == {"prompt_tokens": 40, "completion_tokens": 8, "total_tokens": 48}
        result = await client.get(f"/v1/ocr/jobs/{job['id']}/result")
        direct = await client.post("/v1/ocr", files={"file": ("doc.pdf", pdf(4))})
        assert result.status_code == direct.status_code == 200
        assert result.json() == direct.json()
        lines = await client.get(
            f"/v1/ocr/jobs/{job['id']}/result", headers={"accept": "application/x-ndjson"}
        )
        parsed = [orjson.loads(line) for line in lines.text.splitlines()]
        head = {"object": "ocr.document", "model": fake.served, "layout": "off"}
        assert parsed[0] == {**head, "pages": [1, 2, 3, 4]}
        assert [line["index"] for line in parsed[1:-1]] == [1, 2, 3, 4]
        assert parsed[-1]["object"] == "ocr.summary"
        markdown = await client.get(
            f"/v1/ocr/jobs/{job['id']}/result", headers={"accept": "text/markdown"}
        )
        assert markdown.text == "\n\n".join(["Hello page"] * 4) + "\n"
        assert markdown.headers["x-ocr-job-status"] == "succeeded"


async def test_a_job_is_only_its_keys(fake: FakeVLLM, tmp_path: Path) -> None:
    """Another key's request, an unknown id and a guessed one: the same 404; lists hold only
    the caller's jobs, paged; another key's job id as `after` is a 400 like an unknown one
    (before: it listed the caller's older jobs, confirming that id and its order)."""
    async with gateway(fake, tmp_path / "data") as client:
        ids = [(await submit(client, pdf(1))).json()["id"] for _ in range(3)]
        other = {"authorization": f"Bearer {OTHER_KEY}"}
        for path in (f"/v1/ocr/jobs/{ids[0]}", f"/v1/ocr/jobs/{ids[0]}/result"):
            refused = await client.get(path, headers=other)
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "job_not_found"
        assert (await client.delete(f"/v1/ocr/jobs/{ids[0]}", headers=other)).status_code == 404
        for guess in ("job_AAAAAAAAAAAAAAAAAAAAAA", "1", "../etc/passwd"):
            assert (await client.get(f"/v1/ocr/jobs/{guess}")).status_code == 404
        first = (await client.get("/v1/ocr/jobs", params={"limit": "2"})).json()
        assert [job["id"] for job in first["data"]] == [ids[2], ids[1]]
        assert first["has_more"] is True
        rest = await client.get("/v1/ocr/jobs", params={"limit": "2", "after": first["last_id"]})
        assert [job["id"] for job in rest.json()["data"]] == [ids[0]]
        assert (await client.get("/v1/ocr/jobs", headers=other)).json()["data"] == []
        # another key's job as `after`: the same 400 as an unknown id, confirming nothing
        for after in (ids[1], "job_AAAAAAAAAAAAAAAAAAAAAA"):
            listed = await client.get("/v1/ocr/jobs", params={"after": after}, headers=other)
            assert listed.status_code == 400, listed.text
            assert listed.json()["error"]["param"] == "after"
        assert (await client.get(f"/v1/ocr/jobs?after={ids[1]}")).status_code == 200


@pytest.mark.parametrize("wait", ["x", "-1", "61", "nan", "1e400"])
async def test_a_malformed_wait_is_a_400(fake: FakeVLLM, tmp_path: Path, wait: str) -> None:
    """`wait` must be 0-60 seconds."""
    async with gateway(fake, tmp_path / "data") as client:
        job = (await submit(client, pdf(1))).json()
        response = await client.get(f"/v1/ocr/jobs/{job['id']}", params={"wait": wait})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "wait"


async def test_limits_refuse_before_anything_is_stored(fake: FakeVLLM, tmp_path: Path) -> None:
    """Too many pages (400), too large a file (413), a bad file (400), too many jobs of one key
    in progress (429), a full store (503): each before anything is kept."""
    fake.mode = "hang"  # jobs stay running
    data = tmp_path / "data"
    async with gateway(
        fake, data, job_max_pages=3, job_max_file_bytes=len(pdf(4)) + 10, job_max_active=2,
        job_max_stored_bytes=len(pdf(2)) + len(pdf(1)) + 1000,
    ) as client:  # fmt: skip
        pages = await submit(client, pdf(4))
        assert (pages.status_code, pages.json()["error"]["code"]) == (400, "too_many_pages")
        assert "OCRVL_JOB_MAX_PAGES" in pages.json()["error"]["message"]
        big = await submit(client, pdf(4) + b"x" * 1000)
        assert big.status_code == 413
        assert "OCRVL_JOB_MAX_FILE_BYTES" in big.json()["error"]["message"]
        bigger = await submit(client, pdf(4) + b"x" * 100_000)  # past the body cap too
        assert bigger.status_code == 413
        assert "OCRVL_JOB_MAX_FILE_BYTES" in bigger.json()["error"]["message"]
        bad = await submit(client, b"not a document")
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "unsupported_file")
        assert list((data / "documents").iterdir()) == []
        assert (await submit(client, pdf(2))).status_code == 202
        full = await submit(client, pdf(2))
        assert full.status_code == 503
        assert "OCRVL_JOB_MAX_STORED_BYTES" in full.json()["error"]["message"]
        assert (await submit(client, pdf(1))).status_code == 202
        busy = await submit(client, pdf(1))
        assert busy.status_code == 429
        assert "OCRVL_JOB_MAX_ACTIVE" in busy.json()["error"]["message"]
        assert len(list((data / "documents").iterdir())) == 2
        listed = (await client.get("/v1/ocr/jobs")).json()["data"]
        assert len(listed) == 2
        for job in listed:
            await client.delete(f"/v1/ocr/jobs/{job['id']}")


async def test_cancel_aborts_the_pages_in_flight(fake: FakeVLLM, tmp_path: Path) -> None:
    """DELETE on a running job: its hung page is closed upstream, status cancelled, document
    gone; the pages it finished are kept until its TTL (as OpenAI's batches keep what was
    done) and the result says `cancelled` (the TTL sweep expires it as any ended job)."""
    fake.hang_after = 1  # page 1 is answered, page 2 hangs
    data = tmp_path / "data"
    async with gateway(fake, data, job_page_concurrency=1) as client:
        job = (await submit(client, pdf(3))).json()
        for _ in range(100):
            if len(fake.bodies) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(fake.bodies) == 2
        running = (await client.get(f"/v1/ocr/jobs/{job['id']}")).json()
        assert (running["status"], running["pages_done"]) == ("running", 1)
        cancelled = await client.delete(f"/v1/ocr/jobs/{job['id']}")
        assert cancelled.status_code == 200
        assert (cancelled.json()["status"], cancelled.json()["deleted"]) == ("cancelled", True)
        assert await asyncio.to_thread(fake.disconnected.wait, 10)
        assert list((data / "documents").iterdir()) == []
        status = (await client.get(f"/v1/ocr/jobs/{job['id']}")).json()
        assert (status["status"], status["pages_done"]) == ("cancelled", 1)
        result = await client.get(f"/v1/ocr/jobs/{job['id']}/result")
        assert result.status_code == 200, result.text
        assert result.headers["x-ocr-job-status"] == "cancelled"
        assert [page["index"] for page in result.json()["pages"]] == [1]
        markdown = await client.get(
            f"/v1/ocr/jobs/{job['id']}/result", headers={"accept": "text/markdown"}
        )
        assert markdown.text == "Hello page\n"
        assert status["expires_at"] >= status["finished_at"] + 86_400 - 1  # swept then


async def test_the_wait_returns_when_the_status_changes(
    fake: FakeVLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-poll on a queued job returns once it runs (its one page held until then), well
    before `wait` runs out. The runner claims the job only once the long-poll has read it
    queued: a claim between the submit and that read would leave the poll nothing to see."""
    fake.gate = threading.Event()
    get, claim = SqliteStore.get, SqliteStore.claim
    polling, seen_queued = asyncio.Event(), asyncio.Event()

    async def watched_get(self: SqliteStore, job_id: str) -> Job | None:
        job = await get(self, job_id)
        if polling.is_set() and job is not None and job.status == "queued":
            seen_queued.set()  # the long-poll's first read: the job is queued
        return job

    async def held_claim(self: SqliteStore, holder: str, now: float, lease: float) -> Job | None:
        await seen_queued.wait()
        return await claim(self, holder, time.time(), lease)  # now: the tick's is stale

    monkeypatch.setattr(SqliteStore, "get", watched_get)
    monkeypatch.setattr(SqliteStore, "claim", held_claim)
    async with gateway(fake, tmp_path / "data") as client:
        job = (await submit(client, pdf(1))).json()
        polling.set()
        started = time.monotonic()
        try:
            seen = (await client.get(f"/v1/ocr/jobs/{job['id']}", params={"wait": "30"})).json()
        finally:
            fake.gate.set()
        assert seen["status"] == "running"
        assert time.monotonic() - started < 25


async def test_a_bad_callback_url_is_a_400_and_a_good_one_is_called(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """A private address is refused at submit (nothing stored); an allow-listed receiver gets
    the ended job, signed."""
    from tests.jobs.test_webhook import SECRET, Receiver  # noqa: PLC0415
    from tests.support.servers import serving  # noqa: PLC0415

    with serving(Receiver(failures=0)) as receiver:
        async with gateway(
            fake, tmp_path / "data", webhook_secret=SECRET, webhook_allowed_hosts="127.0.0.1"
        ) as client:
            refused = await submit(client, pdf(1), callback_url="http://10.1.2.3/hook")
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "invalid_callback_url"
            assert (await client.get("/v1/ocr/jobs")).json()["data"] == []
            job = (await submit(client, pdf(2), callback_url=f"{receiver.url}/cb")).json()
            assert job["callback_url"] == f"{receiver.url}/cb"
            await until_ended(client, job["id"])
            assert await asyncio.to_thread(receiver.done.wait, 10)
    headers, body = receiver.received[0]
    event = orjson.loads(body)
    assert event["type"] == "ocr.job.succeeded"
    assert (event["data"]["id"], event["data"]["pages_done"]) == (job["id"], 2)
    assert headers["webhook-id"] == job["id"]


async def test_job_metrics_and_one_access_line_per_event(
    fake: FakeVLLM,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/metrics counts the job by status and its pages with their latency, already when a
    client first sees it ended (the store's clean-up after the move held on purpose until the
    client has read /metrics, as a loaded disk holds it); the access log has one `job` line per
    event, naming the key but never holding it or the pages' text."""
    drop_document = SqliteStore.drop_document
    metrics_read = asyncio.Event()  # the client has seen the job ended and read /metrics
    held_past_the_read: list[bool] = []

    async def slow_drop(self: SqliteStore, job_id: str) -> None:
        try:
            await asyncio.wait_for(metrics_read.wait(), 60)  # generous: fails, not hangs
            held_past_the_read.append(True)
        except TimeoutError:
            held_past_the_read.append(False)  # the job showed ended only after its clean-up
        await drop_document(self, job_id)

    monkeypatch.setattr(SqliteStore, "drop_document", slow_drop)
    access = logging.getLogger("ocrvl.access")
    access.addHandler(caplog.handler)  # the gateway's JSON handler does not propagate
    try:
        async with gateway(fake, tmp_path / "data") as client:
            try:
                job = (await submit(client, pdf(3))).json()
                await until_ended(client, job["id"])
                text = (await client.get("/metrics")).text
            finally:
                metrics_read.set()  # the clean-up goes on (and the gateway can close)
    finally:
        access.removeHandler(caplog.handler)
    assert held_past_the_read == [True], "the job was seen ended only after its document went"
    assert 'ocrvl_jobs_total{status="queued"} 1.0' in text
    assert 'ocrvl_jobs_total{status="succeeded"} 1.0' in text
    assert 'ocrvl_job_pages_total{outcome="done"} 3.0' in text
    assert "ocrvl_job_page_duration_seconds_count 3.0" in text
    assert "ocrvl_job_pages_waiting 0.0" in text
    lines = [r for r in caplog.records if r.getMessage() == "job"]
    assert [r.event for r in lines] == ["created", "started", "ended"]  # type: ignore[attr-defined]
    for record in lines:
        assert record.job_id == job["id"]  # type: ignore[attr-defined]
        assert record.key == "env#1"  # type: ignore[attr-defined]
        assert CLIENT_KEY not in str(record.__dict__)
        assert "Hello page" not in str(record.__dict__)
