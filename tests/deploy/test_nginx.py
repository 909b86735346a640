"""The repository's nginx config in a real nginx, rendered the way the official image renders it.

The environment is the one compose gives the nginx container (from .env.example), moved to a
loopback port and pointed at the test's upstream; tests that change a limit say so.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.deploy.conftest import StartNginx, local_env
from tests.deploy.nginx import Nginx, free_port, nginx_command, prepare
from tests.support.pages import chat_body, document_page
from tests.support.servers import ThreadedServer

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from tests.conftest import GatewayServer

# Limits wide enough that the other bucket never interferes with the one under test.
WIDE_RATE, WIDE_BURST = "10000r/s", "10000"


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def burst(url: str, headers: list[dict[str, str]]) -> tuple[list[Answer], float]:
    """Send one GET per header set, all at once; the answers and the seconds it all took."""

    async def run() -> list[Answer]:
        limits = httpx.Limits(max_connections=len(headers))
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            responses = await asyncio.gather(*(client.get(url, headers=h) for h in headers))
        return [Answer(r.status_code, r.headers, r.content) for r in responses]

    started = time.monotonic()
    answers = asyncio.run(run())
    return answers, time.monotonic() - started


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def assert_openai_error(answer: Answer, status: int, error_type: str, code: str) -> None:
    """The body is OpenAI's error shape with this type and code, served as JSON."""
    assert answer.status == status
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == (error_type, code, None)
    assert error["message"]


def assert_rate_limited(answer: Answer, retry_after: str) -> None:
    assert_openai_error(answer, 429, "rate_limit_error", "rate_limit_exceeded")
    assert answer.headers["retry-after"] == retry_after


def ceiling(rate: float, burst_size: int, seconds: float) -> float:
    """The most requests a limit_req bucket can let through in `seconds` (one spare for timing)."""
    return burst_size + 1 + rate * seconds + 1


# ------------------------------------------------------------------------ config and rendering


def test_rendered_config_passes_nginx_t(nginx_env: dict[str, str], tmp_path: Path) -> None:
    """The template rendered with compose's environment is a config nginx accepts."""
    conf = prepare(tmp_path, local_env(nginx_env, "127.0.0.1:9"))
    rendered = (tmp_path / "conf.d" / "default.conf").read_text()
    assert "${NGINX_" not in rendered
    result = subprocess.run(
        nginx_command(tmp_path, conf, "-t"), capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_rendering_keeps_nginx_variables_and_fills_the_defaults(
    nginx_env: dict[str, str], tmp_path: Path
) -> None:
    """Only NGINX_* variables are substituted: an environment variable named `host` is not."""
    prepare(tmp_path, {**local_env(nginx_env, "127.0.0.1:9"), "host": "leaked", "status": "0"})
    rendered = (tmp_path / "conf.d" / "default.conf").read_text()
    assert "proxy_set_header Host $host;" in rendered
    assert '"$status:$upstream_http_retry_after"' in rendered
    assert "leaked" not in rendered
    assert "rate=50r/s;" in rendered
    assert "burst=20 nodelay;" in rendered
    assert "client_max_body_size 20m;" in rendered
    ocr = rendered.split("location = /v1/ocr {")[1].split("}")[0]
    assert "client_max_body_size 68m;" in ocr  # a whole document, not a page
    assert "proxy_pass http://ocrvl_gateway;" in ocr
    assert "proxy_request_buffering off;" in ocr  # spooled by the gateway, not in nginx's tmpfs
    jobs = rendered.split("location = /v1/ocr/jobs {")[1].split("}")[0]
    assert "client_max_body_size 270m;" in jobs  # a job's document: 200 MiB as base64 JSON
    assert "proxy_request_buffering off;" in jobs
    assert "proxy_read_timeout 660s;" in rendered
    assert "proxy_buffering off;" in rendered
    assert "server_tokens off;" in rendered


# ------------------------------------------------------------ nginx's own errors (no gateway)


def test_unreachable_gateway_gets_openai_502_with_retry_after(start_nginx: StartNginx) -> None:
    """Nothing listens upstream: nginx's 502 is JSON in OpenAI's shape, with Retry-After."""
    with start_nginx(f"127.0.0.1:{free_port()}") as front:
        response = httpx.post(f"{front.url}/v1/chat/completions", json={})
    answer = Answer(response.status_code, response.headers, response.content)
    assert_openai_error(answer, 502, "api_error", "bad_gateway")
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["server"] == "nginx"  # server_tokens off: no version


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/ocr/jobs", "OCRVL_JOB_MAX_FILE_BYTES"), ("/v1/files", "OCRVL_BATCH_MAX_FILE_BYTES")],
)
def test_a_job_over_its_body_cap_gets_nginxs_own_413(
    start_nginx: StartNginx, path: str, limit: str
) -> None:
    """A job's document (or a batch file) over NGINX_JOB_MAX_BODY_SIZE (here 1m) is refused by
    nginx itself, in OpenAI's shape, naming its file limit; the general 20m cap does not apply."""
    with start_nginx(f"127.0.0.1:{free_port()}", NGINX_JOB_MAX_BODY_SIZE="1m") as front:
        response = httpx.post(f"{front.url}{path}", content=b"\0" * (2 * 1024 * 1024))
    answer = Answer(response.status_code, response.headers, response.content)
    assert (answer.status, answer.headers["content-type"]) == (413, "application/json")
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    assert "larger than 1m" in error["message"]
    assert limit in error["message"]
    assert error["param"] == "file"


def test_silent_gateway_gets_openai_504(start_nginx: StartNginx) -> None:
    """The upstream accepts but never answers: after proxy_read_timeout, a 504 in JSON."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with start_nginx(f"127.0.0.1:{port}", NGINX_PROXY_READ_TIMEOUT="1s") as front:
            started = time.monotonic()
            response = httpx.get(f"{front.url}/v1/models", timeout=10)
            waited = time.monotonic() - started
    answer = Answer(response.status_code, response.headers, response.content)
    assert_openai_error(answer, 504, "api_error", "gateway_timeout")
    assert 0.9 < waited < 5


class TooManyRequests:
    """An upstream answering 429, with the Retry-After given in the query string if any."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        query = scope["query_string"].decode()
        if query:
            headers.append((b"retry-after", query.encode()))
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"error": {}}'})


@pytest.mark.parametrize(("upstream_value", "expected"), [("", "1"), ("7", "7")])
def test_upstream_429_always_leaves_with_one_retry_after(
    start_nginx: StartNginx, upstream_value: str, expected: str
) -> None:
    """A 429 from behind nginx keeps its Retry-After, or gets nginx's when it had none."""
    with ThreadedServer(TooManyRequests()) as upstream, start_nginx(upstream.url) as front:
        response = httpx.get(f"{front.url}/v1/models?{upstream_value}")
    assert response.status_code == 429
    assert response.headers.get_list("retry-after") == [expected]


# ------------------------------------------------------------------- the real stack (vLLM CPU)


def models_url(front: Nginx) -> str:
    return f"{front.url}/v1/models"


def assert_throttled_to_5_per_second(answers: list[Answer], seconds: float) -> None:
    """Some 429s, each well-formed; no more 200s than a 5 r/s, burst 5 bucket allows."""
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) == {200, 429}, statuses
    assert statuses[200] <= ceiling(5, 5, seconds), (statuses, seconds)
    for answer in answers:
        if answer.status == 429:
            assert_rate_limited(answer, "1")


@pytest.mark.vllm
def test_a_burst_over_the_key_limit_gets_429s_with_retry_after(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """40 requests at once with one key over a 5 r/s, burst 5 limit: the excess gets 429s."""
    with front_of(
        NGINX_RATE_PER_KEY="5r/s", NGINX_BURST_PER_KEY="5",
        NGINX_RATE_PER_IP=WIDE_RATE, NGINX_BURST_PER_IP=WIDE_BURST,
    ) as front:  # fmt: skip
        answers, seconds = burst(models_url(front), [bearer(gateway.api_key)] * 40)
    assert_throttled_to_5_per_second(answers, seconds)


@pytest.mark.vllm
def test_a_burst_over_the_address_limit_is_throttled_whatever_the_keys(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """One address spreading 40 requests over three keys still meets its own 5 r/s limit."""
    with front_of(
        NGINX_RATE_PER_IP="5r/s", NGINX_BURST_PER_IP="5",
        NGINX_RATE_PER_KEY=WIDE_RATE, NGINX_BURST_PER_KEY=WIDE_BURST,
    ) as front:  # fmt: skip
        keys = [bearer(gateway.api_keys[i % 3]) for i in range(40)]
        answers, seconds = burst(models_url(front), keys)
    assert_throttled_to_5_per_second(answers, seconds)


@pytest.mark.vllm
def test_default_limits_let_steady_traffic_through(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """At 20 r/s, under the default 50 r/s per address and per key, no request is refused."""
    statuses: Counter[int] = Counter()
    with front_of() as front, httpx.Client(headers=bearer(gateway.api_key)) as client:
        started = time.monotonic()
        for index in range(60):
            time.sleep(max(0.0, started + index / 20 - time.monotonic()))
            statuses[client.get(models_url(front)).status_code] += 1
    assert statuses == {200: 60}


@pytest.mark.vllm
def test_default_limits_refuse_a_burst_beyond_rate_and_burst(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """150 requests at once exceed the default 50 r/s with burst 20: the excess gets 429s."""
    with front_of() as front:
        answers, seconds = burst(models_url(front), [bearer(gateway.api_key)] * 150)
    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) == {200, 429}, statuses
    assert 21 <= statuses[200] <= ceiling(50, 20, seconds), (statuses, seconds)


@pytest.mark.vllm
def test_one_keys_burst_does_not_throttle_another_key(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """Key 1 exhausts its bucket; keys 2 (Bearer) and 3 (x-api-key) are served in full."""
    first, second, third = gateway.api_keys
    with front_of(
        NGINX_RATE_PER_KEY="1r/s", NGINX_BURST_PER_KEY="5",
        NGINX_RATE_PER_IP=WIDE_RATE, NGINX_BURST_PER_IP=WIDE_BURST,
    ) as front:  # fmt: skip
        exhausted, _ = burst(models_url(front), [bearer(first)] * 30)
        others, _ = burst(models_url(front), [bearer(second)] * 5 + [{"x-api-key": third}] * 5)
        # The same key in the other header shares its bucket: no second allowance.
        switched, _ = burst(models_url(front), [{"x-api-key": first}] * 3)
    assert Counter(a.status for a in exhausted)[429] >= 20
    assert [a.status for a in others] == [200] * 10
    assert [a.status for a in switched] == [429] * 3


def stream_arrivals(url: str, key: str, body: dict[str, Any]) -> list[float]:
    """Seconds from sending to each `data:` event of a streamed chat completion."""
    arrivals: list[float] = []
    started = time.monotonic()
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - started)
    return arrivals


@pytest.mark.vllm
def test_a_streamed_answer_arrives_chunk_by_chunk(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """Through nginx the events arrive one by one as the engine decodes them: nothing is
    buffered (buffered, they would come in a few bursts of a buffer's size, or all at the end).
    Counted in distinct arrival milliseconds, not timed against a direct run: the engine's load
    differs between two runs, its decode steps are each some milliseconds apart in both."""
    page = document_page(seed=3, width=448, height=448)
    body = chat_body(page, max_completion_tokens=160, stream=True, ignore_eos=True, temperature=0)
    with front_of() as front:
        arrivals = stream_arrivals(front.url, gateway.api_key, body)
    assert len(arrivals) >= 100
    distinct = len({round(t, 3) for t in arrivals})
    assert distinct >= len(arrivals) // 2, (distinct, len(arrivals))


@pytest.mark.vllm
def test_a_page_goes_through_nginx_with_the_openai_sdk(
    front_of: StartNginx, gateway: GatewayServer
) -> None:
    """The OpenAI SDK reads an OCR answer through nginx, under PaddleOCR's model name."""
    page = chat_body(document_page(seed=5, width=448, height=448))
    with front_of() as front:
        client = openai.OpenAI(base_url=f"{front.url}/v1", api_key=gateway.api_key)
        completion = client.chat.completions.create(
            model="PaddleOCR-VL-1.5-0.9B",
            messages=page["messages"],
            max_completion_tokens=16,
            temperature=0,
        )
        lines = front.log_lines()
    assert completion.choices[0].message.content is not None
    assert completion.choices[0].finish_reason in ("stop", "length")
    entry = json.loads(lines[-1])
    assert (entry["uri"], entry["status"], entry["limit_req"]) == (
        "/v1/chat/completions",
        200,
        "PASSED",
    )
    assert gateway.api_key not in "\n".join(lines)


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("size", "said_by"), [(20 * 1024 * 1024 + 1, "nginx"), (20 * 1024 * 1024 - 1024, "gateway")]
)
def test_an_oversize_body_gets_a_413_in_json(
    front_of: StartNginx, gateway: GatewayServer, size: int, said_by: str
) -> None:
    """Over 20 MiB nginx answers 413 itself; just under, the body reaches the gateway."""
    head, tail = b'{"model": "x", "pad": "', b'"}'
    body = head + b"a" * (size - len(head) - len(tail)) + tail
    with front_of() as front:
        response = httpx.post(
            f"{front.url}/v1/chat/completions",
            content=body,
            headers={**bearer(gateway.api_key), "content-type": "application/json"},
            timeout=60,
        )
    answer = Answer(response.status_code, response.headers, response.content)
    if said_by == "nginx":
        assert_openai_error(answer, 413, "invalid_request_error", "request_too_large")
        assert "larger than 20m" in answer.json()["error"]["message"]
    else:  # the gateway's own verdict on a body it could read (here: an unknown model)
        assert answer.status in (400, 404), answer.body[:300]
        assert "error" in answer.json()


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("size", "said_by"), [(68 * 1024 * 1024 + 1, "nginx"), (30 * 1024 * 1024, "gateway")]
)
def test_a_document_may_be_larger_than_a_page_but_not_unbounded(
    front_of: StartNginx, gateway: GatewayServer, size: int, said_by: str
) -> None:
    """/v1/ocr takes bodies past the 20 MiB page cap (the gateway judges a 30 MiB upload), and
    over 68m nginx answers 413 itself, naming the document limit and the `file` field."""
    boundary = "ocrvl-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    body = head + b"\0" * (size - len(head) - len(tail)) + tail
    with front_of() as front:
        response = httpx.post(
            f"{front.url}/v1/ocr",
            content=body,
            headers={
                **bearer(gateway.api_key),
                "content-type": f"multipart/form-data; boundary={boundary}",
            },
            timeout=120,
        )
    answer = Answer(response.status_code, response.headers, response.content)
    error = answer.json()["error"]
    if said_by == "nginx":
        assert (answer.status, answer.headers["content-type"]) == (413, "application/json")
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error", "request_too_large", "file"
        )  # fmt: skip
        assert "larger than 68m" in error["message"]
        assert "OCRVL_MAX_FILE_BYTES" in error["message"]
    else:  # the gateway read all 30 MiB and refused the content, not the size
        assert answer.status == 400, answer.body[:300]
        assert error["param"] == "file"
        assert "larger than" not in error["message"]


@pytest.mark.vllm
@pytest.mark.parametrize(
    "path", ["/metrics", "//metrics", "/%6Detrics", "/metrics/", "/v1/../metrics"]
)
def test_metrics_are_refused_from_outside(
    front_of: StartNginx, gateway: GatewayServer, path: str
) -> None:
    """However the path is spelled, nginx refuses /metrics; the gateway itself serves it."""
    with front_of() as front:
        response = httpx.get(f"{front.url}{path}")
    answer = Answer(response.status_code, response.headers, response.content)
    assert_openai_error(answer, 403, "permission_error", "forbidden")
    assert httpx.get(f"{gateway.url}/metrics").status_code == 200


@pytest.mark.vllm
def test_health_and_readiness_pass_through(front_of: StartNginx) -> None:
    """The gateway's /health and /ready answer through nginx without a key."""
    with front_of() as front:
        health = httpx.get(f"{front.url}/health")
        ready = httpx.get(f"{front.url}/ready")
    assert (health.status_code, health.json()["status"]) == (200, "ok")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
