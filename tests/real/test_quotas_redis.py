"""Per-key limits across two real `ocrvl serve` replicas sharing one real `redis-server`.

Both replicas sit in front of the session's real vLLM engine: a limit is decided before any
backend call, so the engine's speed only sets how long a burst takes, and each burst here is
asserted to finish well inside the one-minute window it is measured in.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from app.auth import RELOAD_EVERY, KeyFile, KeyLimits
from app.quotas.slots import LEASE_PREFIX, RedisSlots
from tests.conftest import VENV_BIN, GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.redis_server import RedisServer

PASSWORD = "s3cret-redis-pass"
RPM = 40
BURST = 60  # 1.5 x RPM, alternating between the two replicas
LEASE = 4.0  # seconds a concurrency lease lives unrenewed in the crash test


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server with a password, on a free loopback port."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), PASSWORD).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A keys file with one key per test, each with its own limits."""
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    keys = KeyFile(path)
    created = {
        "batch": keys.create("batch", KeyLimits(rpm=RPM)),
        "sdk": keys.create("sdk", KeyLimits(rpm=1)),
        "single": keys.create("single", KeyLimits(concurrency=1)),
        "steady": keys.create("steady", KeyLimits(rpm=100_000, concurrency=100)),
    }
    return path, created


@pytest.fixture(scope="module")
def replicas(
    vllm_server: VLLMServer,
    redis_server: RedisServer,
    keys_file: tuple[Path, dict[str, str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayServer, GatewayServer]]:
    """Two real `ocrvl serve` on the same engine, keys file and Redis."""
    log_dir = tmp_path_factory.mktemp("replicas")
    env = {"OCRVL_API_KEYS_FILE": str(keys_file[0]), "OCRVL_REDIS_URL": redis_server.url}
    first = start_gateway(vllm_server, log_dir, ("sk-unused-env-key",), **env)
    try:
        second = start_gateway(vllm_server, log_dir, ("sk-unused-env-key",), **env)
    except BaseException:
        _stop(first.process)
        raise
    yield first, second
    for server in (first, second):
        _stop(server.process)


def tiny_chat(vllm: VLLMServer, **extra: Any) -> dict[str, Any]:
    """The cheapest real completion: one token."""
    return {
        "model": vllm.served_model_name,
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": 1,
        **extra,
    }


def bearer(key: str) -> dict[str, str]:
    """The OpenAI SDK's auth header."""
    return {"authorization": f"Bearer {key}"}


async def storage_of(server: GatewayServer) -> str:
    """What /ready says the limits count in."""
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"{server.url}/ready", timeout=5)
    assert ready.status_code == 200, ready.text
    storage: str = ready.json()["limits"]["storage"]
    return storage


async def wait_for_storage(server: GatewayServer, prefix: str, timeout: float) -> float:
    """Seconds until /ready's limits storage starts with `prefix`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if (await storage_of(server)).startswith(prefix):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"/ready never said {prefix!r} within {timeout} s")


@pytest.mark.vllm
@pytest.mark.anyio
async def test_two_replicas_enforce_one_rpm(
    replicas: tuple[GatewayServer, GatewayServer],
    keys_file: tuple[Path, dict[str, str]],
    vllm_server: VLLMServer,
) -> None:
    """1.5 x RPM requests alternating over two replicas: within 5 % of RPM are accepted."""
    key = keys_file[1]["batch"]
    assert {await storage_of(server) for server in replicas} == {"redis"}
    gate = asyncio.Semaphore(8)

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, httpx.Response]:
        async with gate:
            url = f"{replicas[i % 2].url}/v1/chat/completions"
            return i % 2, await client.post(url, json=tiny_chat(vllm_server), headers=bearer(key))

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as client:
        answers = await asyncio.gather(*(one(client, i) for i in range(BURST)))
    elapsed = time.monotonic() - started
    accepted = [replica for replica, a in answers if a.status_code == 200]
    print(f"accepted {len(accepted)} of {BURST} at RPM {RPM} in {elapsed:.1f} s")  # -rP shows it
    refused = [a for _, a in answers if a.status_code == 429]
    assert elapsed < 30, "the burst must fit in the minute it is measured against"
    assert len(accepted) + len(refused) == BURST  # nothing but 200 and 429
    assert abs(len(accepted) - RPM) <= 0.05 * RPM, (len(accepted), RPM)
    assert set(accepted) == {0, 1}  # both replicas served part of the one budget
    for answer in refused:
        error = answer.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "rate_limit_error",
            "rate_limit_exceeded",
            None,
        )
        assert f"Limit {RPM}" in error["message"]
        assert 1 <= int(answer.headers["retry-after"]) <= 60
        assert answer.headers["x-ratelimit-limit-requests"] == str(RPM)
        assert answer.headers["x-ratelimit-remaining-requests"] == "0"
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")


@pytest.mark.vllm
def test_openai_sdk_raises_rate_limit_error(
    replicas: tuple[GatewayServer, GatewayServer],
    keys_file: tuple[Path, dict[str, str]],
    vllm_server: VLLMServer,
) -> None:
    """The real SDK (max_retries=0) raises RateLimitError on the second replica's 429."""
    key = keys_file[1]["sdk"]
    first, second = (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        for server in replicas
    )
    answer = first.chat.completions.create(**tiny_chat(vllm_server))
    assert answer.choices[0].message.content is not None
    with pytest.raises(openai.RateLimitError) as raised:
        second.chat.completions.create(**tiny_chat(vllm_server))
    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"
    assert int(raised.value.response.headers["retry-after"]) >= 55  # the one request's minute


@pytest.mark.vllm
@pytest.mark.anyio
async def test_concurrency_slot_is_shared_and_freed_on_disconnect(
    replicas: tuple[GatewayServer, GatewayServer],
    keys_file: tuple[Path, dict[str, str]],
    vllm_server: VLLMServer,
) -> None:
    """concurrency=1: a stream open on replica A makes replica B answer 429; closing it frees B."""
    key = keys_file[1]["single"]
    long_stream = tiny_chat(
        vllm_server, max_tokens=vllm_server.max_model_len - 64, ignore_eos=True, stream=True
    )
    async with httpx.AsyncClient(timeout=30) as client:
        url_a, url_b = (f"{server.url}/v1/chat/completions" for server in replicas)
        async with client.stream("POST", url_a, json=long_stream, headers=bearer(key)) as stream:
            assert stream.status_code == 200
            chunks = stream.aiter_raw()  # kept: a dropped iterator closes the connection
            await anext(chunks)
            refused = await client.post(url_b, json=tiny_chat(vllm_server), headers=bearer(key))
            await anext(chunks)  # the stream is still going
        closed = time.monotonic()
        for _ in range(100):  # 5 s at most
            answer = await client.post(url_b, json=tiny_chat(vllm_server), headers=bearer(key))
            if answer.status_code != 429:
                break
            await asyncio.sleep(0.05)
        freed_after = time.monotonic() - closed
    assert refused.status_code == 429
    assert "concurrent" in refused.json()["error"]["message"]
    assert answer.status_code == 200
    assert freed_after < 2.0


async def redis_clock(client: Redis) -> float:
    """Redis's own clock in ms: the clock lease expiries are kept on."""
    seconds, micros = await client.time()
    return seconds * 1000 + micros / 1000


async def redis_clock_past(client: Redis, ms: float) -> None:
    """Wait until Redis's clock reads past `ms` (an expiry a lease acquired or renewed set)."""
    while (now := await redis_clock(client)) <= ms:
        left = (ms - now) / 1000  # seconds on Redis's clock; each reading checks again
        await asyncio.sleep(min(0.05, left + 0.001))


@pytest.mark.anyio
async def test_a_crashed_replicas_leases_expire(redis_server: RedisServer) -> None:
    """Leases held by a replica that stops renewing them free their slots after the lease time.

    Two RedisSlots on the real Redis stand for two replicas; one "crashes" (never releases).
    Each step waits on the expiries Redis holds, read on Redis's clock: past the first one the
    renewed lease still holds the slot, past the renewed one it is free.
    """
    client = Redis.from_url(redis_server.url)
    key = LEASE_PREFIX + "crash-test"
    try:
        crashed, survivor = RedisSlots(client, ttl=LEASE), RedisSlots(client, ttl=LEASE)
        lease = await crashed.acquire("crash-test", 1)
        assert lease is not None
        first = await client.zscore(key, lease)
        assert first is not None
        await redis_clock_past(client, first - LEASE * 1000 / 2)  # halfway through the lease
        await crashed.renew()  # alive a while longer: now good for LEASE s from here
        renewed = await client.zscore(key, lease)
        assert renewed is not None, "the lease was gone before it was renewed"
        assert renewed > first, (first, renewed)
        await redis_clock_past(client, first)  # past the first expiry
        refused = await survivor.acquire("crash-test", 1)
        await redis_clock_past(client, renewed)  # then it "crashes": the lease runs out
        granted = await survivor.acquire("crash-test", 1)
    finally:
        await client.aclose()
    assert refused is None
    assert granted is not None


@pytest.mark.vllm
def test_cli_limits_take_effect_without_restart(
    replicas: tuple[GatewayServer, GatewayServer],
    keys_file: tuple[Path, dict[str, str]],
    vllm_server: VLLMServer,
) -> None:
    """`ocrvl keys create --rpm 2`, then `keys set --rpm 4`: both replicas follow within ~1 s."""
    path = keys_file[0]
    env = {**os.environ, "OCRVL_API_KEYS_FILE": str(path)}

    def ocrvl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "ocrvl"), "keys", *args], capture_output=True, text=True, env=env
        )

    created = ocrvl("create", "late", "--rpm", "2", "--concurrency", "5")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    # The interval that must pass (the subject, not a guess at how long something takes): a
    # keyring re-reads the file on the first request more than RELOAD_EVERY (1 s) after its
    # last check, so every request from here on finds the file as the CLI left it.
    time.sleep(RELOAD_EVERY + 0.5)

    def statuses(count: int) -> list[int]:
        return [
            httpx.post(
                f"{replicas[i % 2].url}/v1/chat/completions",
                json=tiny_chat(vllm_server),
                headers=bearer(key),
                timeout=60,
            ).status_code
            for i in range(count)
        ]

    assert statuses(3) == [200, 200, 429]
    edited = ocrvl("set", "late", "--rpm", "4")
    assert edited.returncode == 0, edited.stderr
    time.sleep(RELOAD_EVERY + 0.5)  # the reload interval again
    assert statuses(3) == [200, 200, 429]  # 4 per minute, the 2 earlier ones included
    listing = ocrvl("list")
    line = next(line for line in listing.stdout.splitlines() if line.startswith("late "))
    assert line.split() == ["late", "4", "5", "none", "none"]  # no page budgets (per day, month)
    assert "sha256" not in listing.stdout
    assert all(h.hex() not in listing.stdout for h in (e.sha256 for e in KeyFile(path).read()))


@pytest.mark.vllm
@pytest.mark.anyio
async def test_redis_killed_mid_run_falls_back_and_returns(
    replicas: tuple[GatewayServer, GatewayServer],
    redis_server: RedisServer,
    keys_file: tuple[Path, dict[str, str]],
    vllm_server: VLLMServer,
) -> None:
    """Redis SIGKILLed under load: every request still gets 200, /ready says memory and why,
    one warning is logged (no password); after a restart the replicas count in Redis again."""
    server = replicas[0]
    key = keys_file[1]["steady"]
    statuses: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            while not stop.is_set():
                answer = await client.post(
                    f"{server.url}/v1/chat/completions",
                    json=tiny_chat(vllm_server),
                    headers=bearer(key),
                )
                statuses.append(answer.status_code)

    async def answers(more: int) -> None:
        """Wait for `more` answers to requests sent from now on (the load sends one at a time,
        so all but the first of them were sent after this call)."""
        wanted, deadline = len(statuses) + more + 1, time.monotonic() + 60
        while len(statuses) < wanted:
            if loader.done():
                loader.result()
                raise AssertionError(f"the load stopped: {statuses}")
            assert time.monotonic() < deadline, f"no {more} answers in 60 s: {statuses}"
            await asyncio.sleep(0.05)

    loader = asyncio.create_task(load())
    try:
        await answers(2)  # under load
        redis_server.kill()
        down_after = await wait_for_storage(server, "memory (redis unreachable: ", 10)
        down_status = await storage_of(server)
        await answers(2)  # admitted while Redis is down
        redis_server.start()
        up_after = await wait_for_storage(server, "redis", 10)
        await answers(2)  # admitted once Redis is back
    finally:
        stop.set()
        await loader
    assert len(statuses) > 5
    assert set(statuses) == {200}, statuses
    assert down_after < 5.0  # pings every second, 0.5 s timeouts (more on a loaded machine)
    assert up_after < 5.0
    log = server.log_path.read_text()
    assert log.count("stopped answering") == 1
    assert log.count("per-key limits are shared through it") == 2  # at start, after restart
    assert PASSWORD not in log + down_status
    check = Redis.from_url(redis_server.url)
    try:
        counted = [k async for k in check.scan_iter("ocrvl*")]
    finally:
        await check.aclose()
    assert counted  # the limits write to the restarted Redis again
