"""Jobs on Redis while Redis is down: a clear 503, and the gateway serves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs.test_api import gateway, submit
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_dead_redis_makes_job_routes_503_not_500(fake: FakeVLLM, tmp_path: Path) -> None:
    """A job runs through a real redis-server; with Redis killed, submit and status answer 503
    `server_overloaded` with Retry-After, and chat is still served."""
    redis = RedisServer(tmp_path, "down-test-pass").start()
    try:
        async with gateway(fake, tmp_path / "data", redis_url=redis.url) as client:
            job = (await submit(client, pdf(1))).json()
            assert job["status"] == "queued"
            redis.kill()
            refused = await submit(client, pdf(1))
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "server_overloaded"
            assert "job store is unreachable" in refused.json()["error"]["message"]
            assert refused.headers["retry-after"] == "5"
            status = await client.get(f"/v1/ocr/jobs/{job['id']}")
            assert status.status_code == 503
            chat = await client.post(
                "/v1/chat/completions",
                json={"model": fake.served, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert chat.status_code == 200
    finally:
        redis.stop()
