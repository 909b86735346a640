"""The real stack in a real Docker Engine, called as a user would: through nginx on 127.0.0.1.

Tests run in file order and share one stack; the last one takes it down.
"""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from PIL import Image

from tests.deploy.docker.conftest import Stack, docker
from tests.deploy.test_hey import run_hey, status_codes
from tests.deploy.test_nginx import (
    Answer,
    assert_openai_error,
    assert_rate_limited,
    bearer,
    burst,
)
from tests.support.pages import chat_body, document_page

# The first test of the tier builds the images and starts the stack (several minutes).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]


def test_ready_through_nginx_published_on_loopback_only(stack: Stack) -> None:
    """/ready answers through nginx, whose one published port is bound to 127.0.0.1."""
    answer = httpx.get(f"{stack.url}/ready", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "ready"
    for service in ("vllm", "gateway", "nginx"):
        bindings = stack.inspect(service)["HostConfig"]["PortBindings"] or {}
        addresses = {b["HostIp"] for published in bindings.values() for b in published}
        assert addresses <= {"127.0.0.1"}, (service, bindings)
    assert stack.inspect("nginx")["HostConfig"]["PortBindings"]["8080/tcp"][0]["HostIp"] == (
        "127.0.0.1"
    )


def test_openai_sdk_plain_and_streamed(stack: Stack) -> None:
    """The OpenAI SDK gets a completion and a stream of chunks through nginx and the gateway."""
    client = OpenAI(base_url=f"{stack.url}/v1", api_key=stack.keys["ci-client"], max_retries=0)
    messages = [{"role": "user", "content": "OCR:"}]
    page = client.chat.completions.create(
        model="PaddleOCR-VL-1.5-0.9B",
        messages=messages,
        max_tokens=8,  # type: ignore[arg-type]
    )
    assert page.choices[0].message.content
    assert page.model == "PaddleOCR-VL-1.5-0.9B"
    chunks = list(
        client.chat.completions.create(
            model="PaddleOCR-VL",
            messages=messages,
            max_tokens=8,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert len(chunks) > 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_paddleocr_style_page_with_mm_processor_kwargs(stack: Stack) -> None:
    """PaddleOCR's request shape (JPEG data URL, mm_processor_kwargs, ...) gets a 200 answer."""
    body = chat_body(
        document_page(seed=3), model="PaddleOCR-VL-1.6-0.9B", max_completion_tokens=32,
        temperature=0, skip_special_tokens=True,
        mm_processor_kwargs={"min_pixels": 112896, "max_pixels": 1003520},
    )  # fmt: skip
    answer = httpx.post(
        f"{stack.url}/v1/chat/completions", json=body, headers=bearer(stack.keys["ci-client"]),
        timeout=120,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"]
    assert answer.json()["usage"]["prompt_tokens"] > 100  # the image reached the model


def test_a_burst_over_the_default_key_limit_gets_429s_with_retry_after(stack: Stack) -> None:
    """100 requests at once with one key over the shipped 50 r/s, burst 20: the excess gets 429s."""
    answers, _ = burst(f"{stack.url}/v1/models", [bearer(stack.keys["ci-burst"])] * 100)
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) == {200, 429}, statuses
    assert statuses[429] >= 20, statuses
    for answer in answers:
        if answer.status == 429:
            assert_rate_limited(answer, "1")


def test_hey_under_the_limit_gets_only_200s(stack: Stack, tmp_path: Path) -> None:
    """`make hey` with PaddleOCR's page through the stack: every page answered."""
    summary = run_hey(stack.url, stack.keys["ci-client"], requests=12, workers=3, tmp_path=tmp_path)
    assert status_codes(summary) == {200: 12}, summary


def test_a_40_mb_document_goes_through_nginx_and_the_read_only_gateway(stack: Stack) -> None:
    """A 40 MB PNG (over nginx's 20m page cap, under the document cap) is read in the hardened
    gateway container: its /tmp tmpfs holds the upload while it is copied, and keeps nothing."""
    noise = Image.frombytes("RGB", (3700, 3700), random.Random(7).randbytes(3700 * 3700 * 3))
    data = io.BytesIO()
    noise.save(data, "PNG", compress_level=1)
    assert data.tell() > 40_000_000
    answer = httpx.post(
        f"{stack.url}/v1/ocr", headers=bearer(stack.keys["ci-client"]), timeout=300,
        files={"file": ("noise.png", data.getvalue(), "image/png")}, data={"max_tokens": "8"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text[:500]
    pages = answer.json()["pages"]
    assert [page["index"] for page in pages] == [1]
    assert pages[0]["text"]
    listing = stack.exec(
        "gateway", "python", "-c", "import json, os; print(json.dumps(os.listdir('/tmp')))"
    )
    assert listing.returncode == 0, listing.stderr
    assert not [name for name in json.loads(listing.stdout) if name.startswith("ocrvl-upload-")]


def test_a_key_created_with_the_image_works_at_once_without_a_restart(stack: Stack) -> None:
    """docs/deploy.md's recipe: `ocrvl keys create` run in the gateway image into the keys
    folder; the running gateway sees the replaced file through the folder secret."""
    started = stack.inspect("gateway")["State"]["StartedAt"]
    created = stack.compose(
        "run", "--rm", "--no-deps", "--volume", f"{stack.home / 'keys'}:/keys", "gateway",
        "ocrvl", "keys", "create", "ci-late", "--file", "/keys/api-keys.json",
    )  # fmt: skip
    key = next(word for word in created.split() if word.startswith("sk-ocrvl-"))
    deadline = time.monotonic() + 30  # generous: the keyring re-reads the file within ~1 s
    while (status := models_status(stack, key)) != 200 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert status == 200
    assert stack.inspect("gateway")["State"]["StartedAt"] == started


def models_status(stack: Stack, key: str) -> int:
    return httpx.get(f"{stack.url}/v1/models", headers=bearer(key), timeout=10).status_code


def trickle(url: str, key: str, stop: threading.Event, sent: list[tuple[Answer, float]]) -> None:
    """GET /v1/models ten times a second until `stop`; each answer and its seconds recorded."""
    with httpx.Client(timeout=15) as client:
        while not stop.is_set():
            started = time.monotonic()
            r = client.get(f"{url}/v1/models", headers=bearer(key))
            sent.append((Answer(r.status_code, r.headers, r.content), time.monotonic() - started))
            time.sleep(0.1)


def test_gateway_restart_under_a_trickle_gets_json_502s_then_200s_again(stack: Stack) -> None:
    """`compose restart gateway`: nginx answers JSON 502/503 with Retry-After, never hangs, and
    the gateway is back (healthy, answering) without anything else restarted."""
    nginx_started = stack.inspect("nginx")["State"]["StartedAt"]
    stop, sent = threading.Event(), list[tuple[Answer, float]]()
    worker = threading.Thread(
        target=trickle, args=(stack.url, stack.keys["ci-trickle"], stop, sent)
    )
    worker.start()
    try:
        deadline = time.monotonic() + 90
        while [answer.status for answer, _ in sent].count(200) < 5:  # the trickle flows
            assert time.monotonic() < deadline, Counter(answer.status for answer, _ in sent)
            time.sleep(0.1)
        stack.compose("restart", "gateway", timeout=120)
        deadline = time.monotonic() + 90
        while stack.inspect("gateway")["State"]["Health"]["Status"] != "healthy":
            assert time.monotonic() < deadline, "the gateway did not become healthy again"
            time.sleep(1)
        served = [answer.status for answer, _ in sent].count(200)
        while [answer.status for answer, _ in sent].count(200) < served + 5:
            assert time.monotonic() < deadline, Counter(answer.status for answer, _ in sent)
            time.sleep(0.2)
    finally:
        stop.set()
        worker.join(timeout=30)
    statuses = Counter(answer.status for answer, _ in sent)
    assert set(statuses) <= {200, 502}, statuses
    assert statuses[502] >= 1, statuses  # the restart was seen
    assert max(seconds for _, seconds in sent) < 10, "a request hung while the gateway was away"
    for answer, _ in sent:
        if answer.status == 502:
            assert_openai_error(answer, 502, "api_error", "bad_gateway")
            assert answer.headers["retry-after"] == "1"
    assert stack.inspect("nginx")["State"]["StartedAt"] == nginx_started


def test_down_leaves_no_container_and_no_network(stack: Stack) -> None:
    """`docker compose down` removes every container and the project's network."""
    print(f"docker tier: service logs in {stack.save_logs()}")
    stack.compose("down", timeout=180)
    assert stack.containers() == []
    assert "ocrvl-test" not in stack.compose("ls", "--all", "--format", "json")
    assert docker("network", "ls", "--quiet", "--filter", "name=ocrvl-test").split() == []
    unreachable = httpx.Client(timeout=5)
    with pytest.raises(httpx.ConnectError):
        unreachable.get(f"{stack.url}/health")
