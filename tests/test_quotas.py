"""Per-key limits in-process: RPM and concurrency 429s, their headers, release on every path."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import KeyFile, KeyLimits
from app.main import create_app
from app.quotas.limiter import go_duration
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import ThreadedServer, free_port, lifespan_client

pytestmark = pytest.mark.anyio
BODY = {"model": SERVED, "messages": [{"role": "user", "content": "OCR:"}]}
STREAM = {**BODY, "stream": True}
DURATION = re.compile(r"^(\d+ms|(\d+h)?(\d+m)?\d+(\.\d+)?s)$")


def keyed(path: Path, name: str, **limits: int) -> str:
    """A new key named `name` in the keys file at `path`, with `limits`."""
    return KeyFile(path).create(name, KeyLimits(**limits))


def file_settings(fake: FakeVLLM, path: Path, **overrides: Any) -> Any:
    """Gateway settings whose keys come from the keys file at `path`."""
    return settings_for(fake.url, api_keys=[], api_keys_file=path, **overrides)


async def chat(client: httpx.AsyncClient, key: str, body: dict[str, Any] = BODY) -> httpx.Response:
    """One chat completion with `key`."""
    return await client.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )


def assert_rate_limited(response: httpx.Response, limit: str) -> dict[str, Any]:
    """A 429 in OpenAI's shape with a Retry-After the OpenAI SDK honours."""
    assert response.status_code == 429, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (
        "rate_limit_error",
        None,
        "rate_limit_exceeded",
    )
    assert limit in error["message"]
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert 1 <= int(response.headers["retry-after-ms"]) <= 60_000
    return error


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0ms"), (0.0204, "20ms"), (1, "1s"), (1.5, "1.5s"), (59.999, "59.999s"),
     (60, "1m0s"), (360, "6m0s"), (61.25, "1m1.25s"), (3600, "1h0m0s"), (-1, "0ms")],
)  # fmt: skip
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, text: str) -> None:
    """x-ratelimit-reset-requests uses Go's duration format, like `1s` and `6m0s`."""
    assert go_duration(seconds) == text


async def test_rpm_limit_answers_429_with_openai_headers(fake: FakeVLLM, tmp_path: Path) -> None:
    """A key's RPM+1-th request in a minute gets 429 with Retry-After and x-ratelimit-*."""
    path = tmp_path / "keys.json"
    key = keyed(path, "alice", rpm=3)
    async with lifespan_client(create_app(file_settings(fake, path))) as client:
        answers = [await chat(client, key) for _ in range(5)]
        metrics = (await client.get("/metrics")).text
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == list("21000")
    assert {a.headers["x-ratelimit-limit-requests"] for a in answers} == {"3"}
    assert all(DURATION.match(a.headers["x-ratelimit-reset-requests"]) for a in answers)
    error = assert_rate_limited(answers[3], "requests per minute (RPM): Limit 3, Used 3")
    assert "'alice'" in error["message"]
    reset = answers[3].headers["x-ratelimit-reset-requests"]
    assert 58 <= int(answers[3].headers["retry-after"]) <= 60, reset  # the oldest of 3 leaves
    assert len(fake.bodies) == 3  # refused requests never reached the backend
    assert 'ocrvl_rate_limited_total{key="alice",limit="rpm"} 2.0' in metrics
    assert key not in metrics


async def test_unlimited_keys_carry_no_limit_headers(gateway_client: httpx.AsyncClient) -> None:
    """With the defaults (0: unlimited) nothing is counted and no x-ratelimit header is sent."""
    answers = [await chat(gateway_client, CLIENT_KEY) for _ in range(30)]
    assert {a.status_code for a in answers} == {200}
    assert not any(h.startswith("x-ratelimit") for a in answers for h in a.headers)


@pytest.mark.parametrize("auth", ["on", "off"])
async def test_settings_defaults_limit_env_keys_and_anonymous(fake: FakeVLLM, auth: str) -> None:
    """OCRVL_KEY_RPM applies to OCRVL_API_KEYS keys (named env#N) and to OCRVL_AUTH=off."""
    overrides: dict[str, Any] = {"key_rpm": 2}
    if auth == "off":
        overrides |= {"auth": "off", "api_keys": []}
    async with lifespan_client(create_app(settings_for(fake.url, **overrides))) as client:
        answers = [await chat(client, CLIENT_KEY) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    name = "env#1" if auth == "on" else "anonymous"
    assert f"{name!r}" in assert_rate_limited(answers[2], "Limit 2")["message"]


async def test_key_file_limits_override_the_defaults(fake: FakeVLLM, tmp_path: Path) -> None:
    """A key's own rpm wins over OCRVL_KEY_RPM; 0 in the file means unlimited."""
    path = tmp_path / "keys.json"
    free, capped = keyed(path, "free", rpm=0), keyed(path, "capped")
    async with lifespan_client(create_app(file_settings(fake, path, key_rpm=1))) as client:
        free_answers = [(await chat(client, free)).status_code for _ in range(5)]
        capped_answers = [(await chat(client, capped)).status_code for _ in range(2)]
    assert (free_answers, capped_answers) == ([200] * 5, [200, 429])


async def test_limit_edits_apply_without_restart(
    fake: FakeVLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`keys set` reaches a running gateway, and the requests already counted stay counted."""
    monkeypatch.setattr("app.auth.RELOAD_EVERY", 0.0)
    path = tmp_path / "keys.json"
    key = keyed(path, "team", rpm=1)
    async with lifespan_client(create_app(file_settings(fake, path))) as client:
        first = [(await chat(client, key)).status_code for _ in range(2)]
        KeyFile(path).set_limits("team", KeyLimits(rpm=3))
        raised = [(await chat(client, key)).status_code for _ in range(3)]
        KeyFile(path).set_limits("team", KeyLimits(rpm=1))
        lowered = await chat(client, key)
    assert first == [200, 429]
    assert raised == [200, 200, 429]  # 3 per minute in all, the first one included
    assert lowered.status_code == 429
    assert lowered.headers["x-ratelimit-limit-requests"] == "1"


async def test_model_listing_is_not_counted(fake: FakeVLLM, tmp_path: Path) -> None:
    """GET /v1/models costs no GPU time, so it is never limited (nor counted against RPM)."""
    path = tmp_path / "keys.json"
    key = keyed(path, "lister", rpm=1, concurrency=1)
    headers = {"authorization": f"Bearer {key}"}
    async with lifespan_client(create_app(file_settings(fake, path))) as client:
        listings = [(await client.get("/v1/models", headers=headers)).status_code for _ in range(5)]
        completion = await chat(client, key)
    assert listings == [200] * 5
    assert completion.status_code == 200


async def admitted_within(client: httpx.AsyncClient, key: str, seconds: float) -> float:
    """Seconds until a non-streaming request of `key` is admitted again."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if (await chat(client, key)).status_code == 200:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"the slot was not given back within {seconds} s")


async def test_stream_holds_its_slot_until_the_client_leaves(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """concurrency=1: a second request is 429 while a stream is open; free once it closes."""
    path = tmp_path / "keys.json"
    key = keyed(path, "streamer", concurrency=1)
    fake.mode = "slow_stream"
    with ThreadedServer(create_app(file_settings(fake, path))) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            headers = {"authorization": f"Bearer {key}"}
            async with client.stream(
                "POST", "/v1/chat/completions", json=STREAM, headers=headers
            ) as stream:
                assert stream.status_code == 200
                chunks = stream.aiter_raw()  # kept: a dropped iterator closes the connection
                await anext(chunks)  # the body is being sent: the endpoint has returned
                # a slot wrongly given back when the endpoint returned would show by now (a
                # negative check: it stays time-based; what it follows is awaited above)
                await asyncio.sleep(0.3)
                refused = await chat(client, key)
                await anext(chunks)  # still streaming
            fake.mode = "ok"
            freed = await admitted_within(client, key, 2.0)
            metrics = (await client.get("/metrics")).text
    error = assert_rate_limited(refused, "concurrent")
    assert "Limit 1 in flight" in error["message"]
    assert fake.disconnected.wait(10), "the stream to the engine was left open"
    assert freed < 1.0
    counted = re.search(
        r'ocrvl_rate_limited_total\{key="streamer",limit="concurrency"\} (\S+)', metrics
    )
    assert counted is not None
    assert float(counted[1]) >= 1  # and any refusals while the disconnect was on its way


@pytest.mark.parametrize(
    ("mode", "body", "status"),
    [
        ("ok", BODY, 200),
        ("ok", STREAM, 200),
        ("broken_stream", STREAM, 200),  # headers out, then an SSE error event
        ("status", BODY, 500),  # the backend's own error, relayed
        ("hang", BODY, 504),  # OCRVL_REQUEST_TIMEOUT
    ],
    ids=["answer", "stream", "broken-stream", "backend-error", "timeout"],
)
async def test_slot_is_given_back_on_every_path(
    fake: FakeVLLM, tmp_path: Path, mode: str, body: dict[str, Any], status: int
) -> None:
    """After any ending (answer, stream, broken stream, error, timeout) the next one is admitted."""
    path = tmp_path / "keys.json"
    key = keyed(path, "one", concurrency=1)
    fake.mode = mode
    settings = file_settings(fake, path, request_timeout=1)
    with ThreadedServer(create_app(settings)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            first = await chat(client, key, body)
            await first.aread()
            fake.mode = "ok"
            second = await chat(client, key)
    assert (first.status_code, second.status_code) == (status, 200)


async def test_concurrency_retry_after_follows_the_hold_time(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """A key whose requests hold slots ~2 s is told to come back in ~2 s, not 1 s."""
    path = tmp_path / "keys.json"
    key = keyed(path, "slow", concurrency=1)
    fake.mode = "hang"
    with ThreadedServer(create_app(file_settings(fake, path, request_timeout=2))) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            assert (await chat(client, key)).status_code == 504  # held the slot 2 s
            fake.chat_started.clear()
            held = asyncio.create_task(chat(client, key))
            # admitted (it holds the slot) once the engine has it
            reached = await asyncio.to_thread(fake.chat_started.wait, 15)
            assert reached, "the second request never reached the engine"
            refused = await chat(client, key)
            await held
    assert_rate_limited(refused, "concurrent")
    assert 2 <= int(refused.headers["retry-after"]) <= 3  # 2 s and a little, rounded up


async def test_unreachable_redis_falls_back_to_memory(
    fake: FakeVLLM, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis down at start: requests are served and limited in memory; /ready says why.

    The Redis password appears in neither /ready nor the log.
    """
    path = tmp_path / "keys.json"
    key = keyed(path, "alice", rpm=2)
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    logging.getLogger("ocrvl").propagate = True
    app = create_app(file_settings(fake, path, redis_url=url))
    logging.getLogger("ocrvl").propagate = True
    with caplog.at_level(logging.INFO, logger="ocrvl.quotas"):
        async with lifespan_client(app) as client:
            answers = [(await chat(client, key)).status_code for _ in range(3)]
            ready = await client.get("/ready")
    assert answers == [200, 200, 429]
    assert ready.status_code == 200
    storage = ready.json()["limits"]["storage"]
    assert storage.startswith("memory (redis unreachable: ")
    warnings = [r for r in caplog.records if r.name == "ocrvl.quotas"]
    assert len(warnings) == 1
    assert "127.0.0.1" in warnings[0].getMessage()
    assert ":***@" in warnings[0].getMessage()
    assert "hunter2" not in caplog.text + storage + ready.text


async def test_ready_names_memory_storage_without_redis(
    gateway_client: httpx.AsyncClient,
) -> None:
    """Without OCRVL_REDIS_URL /ready says the limits count in memory."""
    ready = await gateway_client.get("/ready")
    assert ready.json()["limits"] == {"storage": "memory"}


async def test_rpm_refusal_gives_the_slot_back(fake: FakeVLLM, tmp_path: Path) -> None:
    """A request refused for RPM after taking a slot returns it: the next refusal is RPM again."""
    path = tmp_path / "keys.json"
    key = keyed(path, "both", rpm=1, concurrency=1)
    async with lifespan_client(create_app(file_settings(fake, path))) as client:
        answers = [await chat(client, key) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 429, 429]
    for refused in answers[1:]:
        assert_rate_limited(refused, "requests per minute (RPM): Limit 1")
