"""Batches on a real redis-server (OCRVL_REDIS_URL): the same API, beside the jobs' records."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.batches.test_api import ENDED, batch_of, gateway, jsonl, lines_of, request_line, until
from tests.jobs.test_api import submit, until_ended
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_batch_and_a_job_share_one_redis(fake: FakeVLLM, tmp_path: Path) -> None:
    """A batch and a job through one Redis: each completes in its own records (the job lists
    no batch, the batch list no job), and the batch's files are read back from Redis."""
    redis = RedisServer(tmp_path, "batch-test-pass").start()
    try:
        async with gateway(fake, tmp_path / "data", redis_url=redis.url) as client:
            job = (await submit(client, pdf(1))).json()
            batch = await batch_of(client, jsonl(request_line("a"), {"custom_id": "b"}))
            done = await until(client, batch["id"], ENDED)
            assert (await until_ended(client, job["id"]))["status"] == "succeeded"
            assert done["status"] == "completed"
            assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
            assert [
                line["custom_id"] for line in await lines_of(client, done["output_file_id"])
            ] == ["a"]
            assert [
                line["custom_id"] for line in await lines_of(client, done["error_file_id"])
            ] == ["b"]
            jobs = (await client.get("/v1/ocr/jobs")).json()["data"]
            batches = (await client.get("/v1/batches")).json()["data"]
            assert ([j["id"] for j in jobs], [b["id"] for b in batches]) == (
                [job["id"]],
                [batch["id"]],
            )
            files = (await client.get("/v1/files")).json()["data"]
            assert {f["purpose"] for f in files} == {"batch", "batch_output"}
            assert len(files) == 3
            deleted = await client.delete(f"/v1/files/{done['output_file_id']}")
            assert deleted.json()["deleted"] is True
            assert (await client.get(f"/v1/files/{done['output_file_id']}")).status_code == 404
    finally:
        redis.stop()
