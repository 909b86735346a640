"""Usage per key through real `ocrvl serve` in front of the session's real vLLM engine.

The store's token counts equal what the engine told the client (streamed and not, asked for or
not), a stream the client asked no usage of reaches it as vLLM would have sent it, totals outlive
a `kill -9`, another key's usage is never shown, and two replicas on a real `redis-server` hold
one 20-page budget between them.
"""

from __future__ import annotations

import asyncio
import csv
import io
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from app.auth import KeyFile, KeyLimits
from tests.conftest import VENV_BIN, GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.pages import data_url, document_page
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
PAGE = data_url(document_page(seed=3, width=320, height=452))
BUDGET = 20
FLUSH = "0.5"  # seconds between usage writes, so the tests wait little
COUNTED = ("requests", "pages", "prompt_tokens", "completion_tokens")  # the store's columns


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A keys file: `meter` and `other` without budgets, `capped` with 20 pages a day."""
    path = tmp_path_factory.mktemp("usage-keys") / "keys.json"
    made = KeyFile(path)
    return path, {
        "meter": made.create("meter"),
        "other": made.create("other"),
        "capped": made.create("capped", KeyLimits(pages_per_day=BUDGET)),
    }


def serve(vllm: VLLMServer, keys: Path, log_dir: Path, **env: str) -> GatewayServer:
    """A real `ocrvl serve` with the keys file and a short flush interval."""
    settings = {"OCRVL_API_KEYS_FILE": str(keys), "OCRVL_USAGE_FLUSH_INTERVAL": FLUSH, **env}
    return start_gateway(vllm, log_dir, ("sk-unused-env-key",), **settings)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite gateway's data dir."""
    return tmp_path_factory.mktemp("usage-data")


@pytest.fixture(scope="module")
def gateway(
    vllm_server: VLLMServer, keys: tuple[Path, dict[str, str]], data_dir: Path
) -> Iterator[GatewayServer]:
    """One real `ocrvl serve` keeping usage in `data_dir`'s SQLite file."""
    server = serve(vllm_server, keys[0], data_dir, OCRVL_DATA_DIR=str(data_dir))
    yield server
    _stop(server.process)


def page_request(vllm: VLLMServer, **extra: Any) -> dict[str, Any]:
    """One small page, four tokens exactly (ignore_eos), the same answer every time."""
    return {
        "model": vllm.served_model_name,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": PAGE}},
                    {"type": "text", "text": "OCR:"},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


def cli_usage(data_dir: Path, *args: str) -> list[dict[str, str]]:
    """`ocrvl keys usage --csv` rows read from the store in `data_dir`."""
    done = subprocess.run(
        [str(VENV_BIN / "ocrvl"), "keys", "usage", *args, "--csv", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return list(csv.DictReader(io.StringIO(done.stdout)))


def stored(data_dir: Path, key: str, want: dict[str, int], within: float = 10.0) -> dict[str, int]:
    """The key's totals in the store (summed over days), once they equal `want` or time is up."""
    deadline = time.monotonic() + within
    while True:
        rows = cli_usage(data_dir, key)
        totals = {name: sum(int(row[name]) for row in rows) for name in want}
        if totals == want or time.monotonic() > deadline:
            return totals
        time.sleep(0.2)


async def test_stored_tokens_equal_what_the_client_was_told(
    gateway: GatewayServer,
    vllm_server: VLLMServer,
    keys: tuple[Path, dict[str, str]],
    data_dir: Path,
) -> None:
    """Two answers whole and two streamed with include_usage, through the real OpenAI SDK:
    the store holds the sum of the usage the client got; a stream without include_usage gets
    no usage chunk and still counts the engine's exact tokens."""
    sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=keys[1]["meter"])
    body = page_request(vllm_server)
    extra = {"ignore_eos": True}
    told: list[tuple[int, int]] = []  # (prompt, completion) of each answer
    for _ in range(2):
        answer = await sdk.chat.completions.create(
            model=body["model"], messages=body["messages"], max_tokens=4, temperature=0,
            extra_body=extra,
        )  # fmt: skip
        assert answer.usage is not None
        told.append((answer.usage.prompt_tokens, answer.usage.completion_tokens))
    for _ in range(2):
        chunks = await sdk.chat.completions.create(
            model=body["model"], messages=body["messages"], max_tokens=4, temperature=0,
            extra_body=extra, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        usages = [chunk.usage async for chunk in chunks if chunk.usage is not None]
        assert len(usages) == 1
        told.append((usages[0].prompt_tokens, usages[0].completion_tokens))
    unasked = await sdk.chat.completions.create(
        model=body["model"], messages=body["messages"], max_tokens=4, temperature=0,
        extra_body=extra, stream=True,
    )  # fmt: skip
    assert [chunk.usage async for chunk in unasked if chunk.usage is not None] == []
    assert len(set(told)) == 1  # the same page, four tokens: the engine counts it alike
    prompt, completion = told[0]  # so the unasked stream's counts are these too
    want = {"requests": 5, "pages": 5, "prompt_tokens": 5 * prompt}
    want["completion_tokens"] = 5 * completion
    assert stored(data_dir, "meter", want) == want
    await sdk.close()


def stream_facts(stream: bytes) -> dict[str, Any]:
    """What a chat stream says, whatever its chunking: vLLM merges tokens that are ready at
    once into one chunk, so two runs of one request differ in chunk boundaries (by timing),
    not in their text, fields, finish reason or ending."""
    events = [event for event in stream.split(b"\n\n") if event]
    chunks = [orjson.loads(event.removeprefix(b"data: ")) for event in events[:-1]]
    deltas = [choice["delta"] for chunk in chunks for choice in chunk["choices"]]
    return {
        "ending": events[-1],
        "first": {k: v for k, v in chunks[0].items() if k not in ("id", "created")},
        "text": "".join(delta.get("content") or "" for delta in deltas),
        "finish": [c["finish_reason"] for chunk in chunks for c in chunk["choices"]][-1],
        "fields": {tuple(sorted(chunk)) for chunk in chunks[1:]},
        "choice_fields": {tuple(sorted(c)) for chunk in chunks for c in chunk["choices"]},
    }


async def test_a_stream_without_include_usage_is_what_vllm_would_send(
    gateway: GatewayServer, vllm_server: VLLMServer, keys: tuple[Path, dict[str, str]]
) -> None:
    """The gateway asks vLLM for the usage chunk and takes it out: the client gets vLLM's own
    stream for the request as the client sent it (the same first chunk, text, fields, finish
    reason and `[DONE]`; chunk boundaries are vLLM's timing, compared apart from them)."""
    body = page_request(vllm_server, stream=True)
    async with httpx.AsyncClient(timeout=120) as client:
        through = await client.post(
            f"{gateway.url}/v1/chat/completions", json=body,
            headers={"authorization": f"Bearer {keys[1]['meter']}"},
        )  # fmt: skip
        direct = await client.post(
            f"{vllm_server.url}/v1/chat/completions", json=body,
            headers={"authorization": f"Bearer {vllm_server.api_key}"},
        )  # fmt: skip
    assert through.status_code == direct.status_code == 200
    assert b'"usage"' not in through.content
    assert stream_facts(through.content) == stream_facts(direct.content)
    assert stream_facts(direct.content)["ending"] == b"data: [DONE]"


async def test_another_keys_usage_is_never_shown(
    gateway: GatewayServer,
    vllm_server: VLLMServer,
    keys: tuple[Path, dict[str, str]],
    data_dir: Path,
) -> None:
    """`other` sees its own usage only, whatever it asks; the store holds names, never keys."""
    async with httpx.AsyncClient(timeout=120) as client:
        headers = {"authorization": f"Bearer {keys[1]['other']}"}
        answer = await client.post(
            f"{gateway.url}/v1/chat/completions", json=page_request(vllm_server), headers=headers
        )
        assert answer.status_code == 200
        shown = await client.get(f"{gateway.url}/v1/usage?key=meter", headers=headers)
    assert shown.status_code == 200
    assert shown.json()["key"] == "other"
    assert shown.json()["total"]["requests"] == 1
    assert "meter" not in shown.text
    with sqlite3.connect(data_dir / "jobs.sqlite3") as db:
        names = {row[0] for row in db.execute("SELECT key FROM usage_days")}
    assert names <= {"meter", "other", "capped"}
    assert not any(key in (gateway.log_path.read_text() + str(names)) for key in keys[1].values())


async def test_totals_survive_a_kill_and_restart(
    vllm_server: VLLMServer, keys: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Counts flushed before a `kill -9` are there after a restart on the same data dir, and
    the new gateway adds to them."""
    env = {"OCRVL_DATA_DIR": str(tmp_path)}
    headers = {"authorization": f"Bearer {keys[1]['meter']}"}
    first = serve(vllm_server, keys[0], tmp_path, **env)
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(3):
                answer = await client.post(
                    f"{first.url}/v1/chat/completions", json=page_request(vllm_server),
                    headers=headers,
                )  # fmt: skip
                assert answer.status_code == 200
            before = (await client.get(f"{first.url}/v1/usage", headers=headers)).json()["total"]
        # what a crash may not lose: the counts once a flush has written them to the store
        flushed = {name: before[name] for name in COUNTED}
        assert stored(tmp_path, "meter", flushed, within=60) == flushed, "no flush in 60 s"
    finally:
        first.process.kill()  # SIGKILL: no shutdown flush
        first.process.wait()
    second = serve(vllm_server, keys[0], tmp_path, **env)
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            after = (await client.get(f"{second.url}/v1/usage", headers=headers)).json()["total"]
            assert after == before
            assert before["requests"] == 3
            answer = await client.post(
                f"{second.url}/v1/chat/completions", json=page_request(vllm_server),
                headers=headers,
            )  # fmt: skip
            assert answer.status_code == 200
            again = (await client.get(f"{second.url}/v1/usage", headers=headers)).json()["total"]
        assert again["requests"] == 4
    finally:
        _stop(second.process)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server with a password, on a free loopback port."""
    server = RedisServer(tmp_path_factory.mktemp("usage-redis"), "usage-redis-pass").start()
    yield server
    server.stop()


async def test_two_replicas_hold_one_daily_budget(
    vllm_server: VLLMServer,
    keys: tuple[Path, dict[str, str]],
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """A 20-page daily budget over two replicas on one Redis, 26 pages sent to both at once:
    20 served, the others 429 insufficient_quota naming the budget; both replicas then say 20."""
    env = {"OCRVL_REDIS_URL": redis_server.url, "OCRVL_DATA_DIR": str(tmp_path)}
    replicas = [serve(vllm_server, keys[0], tmp_path, **env) for _ in range(2)]
    headers = {"authorization": f"Bearer {keys[1]['capped']}"}
    body = page_request(vllm_server, max_tokens=1)
    try:
        async with httpx.AsyncClient(timeout=300) as client:
            gate = asyncio.Semaphore(8)

            async def send(i: int) -> httpx.Response:
                async with gate:
                    url = f"{replicas[i % 2].url}/v1/chat/completions"
                    return await client.post(url, json=body, headers=headers)

            answers = await asyncio.gather(*(send(i) for i in range(BUDGET + 6)))
            statuses = sorted(answer.status_code for answer in answers)
            assert statuses == [200] * BUDGET + [429] * 6
            refused = [answer for answer in answers if answer.status_code == 429]
            assert {answer.json()["error"]["code"] for answer in refused} == {"insufficient_quota"}
            assert all("pages-per-day" in answer.json()["error"]["message"] for answer in refused)
            for replica in replicas:
                usage = (await client.get(f"{replica.url}/v1/usage", headers=headers)).json()
                assert usage["budgets"][0]["used"] == BUDGET
                assert usage["total"]["pages"] == BUDGET
    finally:
        for replica in replicas:
            _stop(replica.process)
