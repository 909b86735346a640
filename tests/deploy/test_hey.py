"""`make hey` (scripts/hey.sh) through a real nginx, the real gateway and the real vLLM CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.deploy.compose import ROOT
from tests.deploy.conftest import StartNginx

if TYPE_CHECKING:
    from tests.conftest import GatewayServer


def run_hey(url: str, key: str, requests: int, workers: int, tmp_path: Path) -> str:
    """`make hey` against `url` with a small budget per page; hey's printed summary."""
    env = {
        **os.environ,
        "URL": url,
        "KEY": key,
        "N": str(requests),
        "C": str(workers),
        "MAX_TOKENS": "8",  # the tiny model on a CPU: keep each page short
        "TIMEOUT": "120",
        "BODY": str(tmp_path / "request.json"),
        "PYTHON": sys.executable,
    }
    result = subprocess.run(
        ["make", "--no-print-directory", "hey"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def status_codes(summary: str) -> Counter[int]:
    """hey's "Status code distribution" as status → count."""
    assert "Status code distribution:" in summary, summary
    assert "Error distribution:" not in summary, summary
    return Counter(
        {
            int(code): int(count)
            for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", summary)
        }
    )


@pytest.mark.vllm
def test_hey_through_nginx_gets_only_200s(
    front_of: StartNginx, gateway: GatewayServer, tmp_path: Path
) -> None:
    """A small `make hey` run under the default limits: every page is answered."""
    with front_of() as front:
        summary = run_hey(front.url, gateway.api_key, requests=8, workers=2, tmp_path=tmp_path)
    assert status_codes(summary) == {200: 8}
    body = json.loads((tmp_path / "request.json").read_bytes())
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/jpeg")
    assert body["mm_processor_kwargs"] == {"min_pixels": 112896, "max_pixels": 1003520}


@pytest.mark.vllm
def test_hey_over_a_low_key_limit_shows_429s(
    front_of: StartNginx, gateway: GatewayServer, tmp_path: Path
) -> None:
    """With the key limit set to 1 r/s, burst 2 on purpose, hey reports 200s and 429s only."""
    with front_of(
        NGINX_RATE_PER_KEY="1r/s", NGINX_BURST_PER_KEY="2",
        NGINX_RATE_PER_IP="10000r/s", NGINX_BURST_PER_IP="10000",
    ) as front:  # fmt: skip
        summary = run_hey(front.url, gateway.api_key, requests=20, workers=10, tmp_path=tmp_path)
    codes = status_codes(summary)
    assert set(codes) == {200, 429}, summary
    assert codes[429] >= 10, summary
