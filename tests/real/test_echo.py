"""The real `ocrvl serve`, in front of the real vLLM, repeats no 2 MB name whole: neither in its
404 nor in its access line."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import GatewayServer

pytestmark = pytest.mark.vllm
BIG = 2_000_000


def access_line(gateway: GatewayServer, request_id: str) -> str:
    """The gateway log's access line of `request_id` (written once the answer went out)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in gateway.log_path.read_text(errors="replace").splitlines():
            if request_id in line and '"msg":"request"' in line:
                return line
        time.sleep(0.1)
    pytest.fail(f"no access line for {request_id} in {gateway.log_path}")


def test_a_2_mb_model_name_is_answered_and_logged_in_under_1_kb(gateway: GatewayServer) -> None:
    """A 2,000,000-character `model`: a 404 model_not_found of under 1 KB, and an access line
    of under 1 KB that keeps the name's start and its length."""
    body = {"model": "m" * BIG, "messages": [{"role": "user", "content": "OCR:"}]}
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {gateway.api_key}"},
        timeout=60,
    )
    assert response.status_code == 404
    assert len(response.content) < 1024
    assert response.json()["error"]["code"] == "model_not_found"
    assert f"({BIG} characters)" in response.json()["error"]["message"]
    line = access_line(gateway, response.headers["x-request-id"])
    assert len(line.encode()) < 1024
    logged = json.loads(line)
    assert logged["status"] == 404
    assert logged["model"].startswith("mmmm")
    assert logged["model"].endswith(f"({BIG} characters)")
