"""`Idempotency-Key` on submissions (issue 51): the same key and request give back the first
answer, another request is a 422, a duplicate still being accepted a 409, a bad key a 400.

In-process gateway in front of FakeVLLM; the records live in the real SQLite store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
OTHER_KEY = "sk-test-other-client-key"


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, data_dir: Path, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process, its store in `data_dir`, two client keys."""
    settings = settings_for(
        fake.url, api_keys=[CLIENT_KEY, OTHER_KEY], data_dir=data_dir, preprocess_workers=1,
        **overrides,
    )  # fmt: skip
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


DOCUMENTS = {pages: pdf(pages) for pages in (2, 3)}  # made once: a PDF made again differs (dates)


def job_file(pages: int = 2) -> dict[str, Any]:
    return {"file": ("doc.pdf", DOCUMENTS[pages], "application/pdf")}


def once(key: str) -> dict[str, str]:
    return {"idempotency-key": key}


async def jobs_of(client: httpx.AsyncClient) -> list[str]:
    return [job["id"] for job in (await client.get("/v1/ocr/jobs")).json()["data"]]


async def test_the_same_key_and_job_twice_make_one_job(fake: FakeVLLM, tmp_path: Path) -> None:
    """The second submission answers the first job (202, same id and Location), replayed."""
    async with gateway(fake, tmp_path) as client:
        first = await client.post("/v1/ocr/jobs", files=job_file(), headers=once('"k-1"'))
        second = await client.post("/v1/ocr/jobs", files=job_file(), headers=once('"k-1"'))
        listed = await jobs_of(client)
    assert (first.status_code, second.status_code) == (202, 202)
    assert second.json()["id"] == first.json()["id"]
    assert second.headers["location"] == first.headers["location"]
    assert second.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert listed == [first.json()["id"]]


async def test_the_same_key_with_another_request_is_a_422(fake: FakeVLLM, tmp_path: Path) -> None:
    """Another file, or other options, under a used key: 422 naming the header; no job."""
    async with gateway(fake, tmp_path) as client:
        await client.post("/v1/ocr/jobs", files=job_file(2), headers=once("k-2"))
        other_file = await client.post("/v1/ocr/jobs", files=job_file(3), headers=once("k-2"))
        other_task = await client.post(
            "/v1/ocr/jobs", files=job_file(2), data={"task": "table"}, headers=once("k-2")
        )
        listed = await jobs_of(client)
    for answer in (other_file, other_task):
        assert answer.status_code == 422
        assert answer.json()["error"]["param"] == "Idempotency-Key"
        assert answer.json()["error"]["code"] == "idempotency_key_reused"
    assert len(listed) == 1


async def test_keys_are_kept_per_api_key(fake: FakeVLLM, tmp_path: Path) -> None:
    """Another API key's submission under the same Idempotency-Key is its own job."""
    async with gateway(fake, tmp_path) as client:
        mine = await client.post("/v1/ocr/jobs", files=job_file(), headers=once("shared"))
        theirs = await client.post(
            "/v1/ocr/jobs", files=job_file(),
            headers={**once("shared"), "authorization": f"Bearer {OTHER_KEY}"},
        )  # fmt: skip
    assert theirs.status_code == 202
    assert theirs.json()["id"] != mine.json()["id"]


async def test_concurrent_duplicates_make_one_job(fake: FakeVLLM, tmp_path: Path) -> None:
    """Five submissions with one key at once: one job; each other answer is that job again
    or a 409 idempotency_key_in_use (the first was still being accepted)."""
    async with gateway(fake, tmp_path) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/ocr/jobs", files=job_file(), headers=once("race")) for _ in range(5))
        )
        listed = await jobs_of(client)
    assert len(listed) == 1
    accepted = [a for a in answers if a.status_code == 202]
    assert {a.json()["id"] for a in accepted} == set(listed)
    for answer in answers:
        if answer.status_code != 202:
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "idempotency_key_in_use"
            assert answer.headers["retry-after"] == "1"


async def test_a_refused_submission_leaves_the_key_free(fake: FakeVLLM, tmp_path: Path) -> None:
    """A 400 (a bad option) keeps nothing: the corrected request under the key is accepted."""
    async with gateway(fake, tmp_path) as client:
        bad = await client.post(
            "/v1/ocr/jobs", files=job_file(), data={"task": "nope"}, headers=once("k-3")
        )
        good = await client.post("/v1/ocr/jobs", files=job_file(), headers=once("k-3"))
    assert (bad.status_code, good.status_code) == (400, 202)


@pytest.mark.parametrize(
    "value",
    ["", '""', "x" * 256, "caf\u00e9", "a\tb", '"a"b"', "a\\b"],
    ids=["empty", "empty-string", "over-255", "non-ascii", "control", "quote", "backslash"],
)
async def test_a_malformed_or_oversized_key_is_a_400_naming_the_header(
    fake: FakeVLLM, tmp_path: Path, value: str
) -> None:
    """Each bad Idempotency-Key: 400 invalid_idempotency_key with `param` the header, before
    anything is kept."""
    async with gateway(fake, tmp_path) as client:
        answer = await client.post(
            "/v1/ocr/jobs", files=job_file(), headers={"idempotency-key": value.encode("utf-8")}
        )
        listed = await jobs_of(client)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("Idempotency-Key", "invalid_idempotency_key")
    assert "Idempotency-Key" in error["message"]
    assert listed == []


async def test_a_key_sent_twice_in_one_request_is_a_400(fake: FakeVLLM, tmp_path: Path) -> None:
    """Two Idempotency-Key headers: 400 naming it."""
    async with gateway(fake, tmp_path) as client:
        answer = await client.post(
            "/v1/ocr/jobs", files=job_file(),
            headers=[("idempotency-key", "a"), ("idempotency-key", "b")],
        )  # fmt: skip
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "Idempotency-Key"


async def test_files_and_batches_are_idempotent_too(fake: FakeVLLM, tmp_path: Path) -> None:
    """`/v1/files` and `/v1/batches`: the same key and request give the same file and batch;
    another file's bytes under the file's key are a 422."""
    line = (
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
        b'{"model": "fake-paddleocr-vl", "messages": [{"role": "user", "content": "hi"}]}}\n'
    )
    form = {"purpose": "batch"}
    async with gateway(fake, tmp_path) as client:
        files = [
            await client.post(
                "/v1/files", files={"file": ("in.jsonl", line)}, data=form, headers=once("f")
            )
            for _ in range(2)
        ]
        other = await client.post(
            "/v1/files", files={"file": ("in.jsonl", line * 2)}, data=form, headers=once("f")
        )
        file_id = files[0].json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}  # fmt: skip
        batches = [await client.post("/v1/batches", json=body, headers=once("b")) for _ in range(2)]
        listed = (await client.get("/v1/files")).json()["data"]
        batch_list = (await client.get("/v1/batches")).json()["data"]
    assert [f.status_code for f in files] == [200, 200]
    assert files[1].json()["id"] == file_id
    assert other.status_code == 422
    assert [f["id"] for f in listed] == [file_id]
    assert [b.status_code for b in batches] == [200, 200]
    assert batches[1].json()["id"] == batches[0].json()["id"]
    assert len(batch_list) == 1
