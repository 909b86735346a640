"""Cancellation on the real engine: a client that gives up, or a deadline, frees vLLM at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayServer, VLLMServer, _stop, running_requests, start_gateway
from tests.support.prometheus import metric

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
FREED_WITHIN = 1.0  # seconds from the client's departure to vLLM running nothing
INTO = 32  # tokens generated before the client leaves: well into the generation


def long_generation(vllm: VLLMServer, stream: bool) -> dict[str, object]:
    """A request that would keep the engine busy for many seconds."""
    return {
        "model": "PaddleOCR-VL-1.5-0.9B",
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": vllm.max_model_len - 64,
        "ignore_eos": True,
        "stream": stream,
    }


async def running(vllm: VLLMServer) -> float:
    """vLLM's own count of requests it is running now."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{vllm.url}/metrics", timeout=5)).text
    return running_requests(text)


async def generated(vllm: VLLMServer) -> float:
    """vLLM's own count of the tokens it has generated."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{vllm.url}/metrics", timeout=5)).text
    return metric(text, "vllm:generation_tokens_total")


async def wait_for_running(vllm: VLLMServer, predicate: object, timeout: float) -> float:
    """Poll the running count until `predicate(count)`; return the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate(await running(vllm)):  # type: ignore[operator]
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"vllm:num_requests_running never matched within {timeout} s")


@pytest.fixture(scope="module")
def short_deadline_gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A second real gateway on the same engine whose OCRVL_REQUEST_TIMEOUT is 3 s."""
    server = start_gateway(
        vllm_server, Path(tmp_path_factory.mktemp("gw-timeout")), ("sk-timeout",),
        OCRVL_REQUEST_TIMEOUT="3",
    )  # fmt: skip
    yield server
    _stop(server.process)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_client_giving_up_frees_the_engine(
    gateway: GatewayServer, vllm_server: VLLMServer, stream: bool
) -> None:
    """The client disconnects mid-generation; vLLM runs nothing within a second."""
    await wait_for_running(vllm_server, lambda n: n == 0, 30)
    headers = {"authorization": f"Bearer {gateway.api_key}"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=120) as client:

        async def call() -> None:
            async with client.stream(
                "POST", "/v1/chat/completions", json=long_generation(vllm_server, stream)
            ) as response:
                assert response.status_code == 200
                async for _ in response.aiter_raw():
                    pass

        before = await generated(vllm_server)
        task = asyncio.create_task(call())
        await wait_for_running(vllm_server, lambda n: n >= 1, 30)
        deadline = time.monotonic() + 60
        while await generated(vllm_server) < before + INTO:  # well into the generation
            assert time.monotonic() < deadline, f"vLLM generated no {INTO} tokens in 60 s"
            assert not task.done(), "the long generation ended before it was under way"
            await asyncio.sleep(0.05)
        assert not task.done(), "the long generation ended on its own"
        task.cancel()  # the client closes its connection
        with pytest.raises(asyncio.CancelledError):
            await task
    freed = await wait_for_running(vllm_server, lambda n: n == 0, 10)
    assert freed <= FREED_WITHIN, f"vLLM still ran the request {freed:.2f} s after the client left"


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_gateway_deadline_frees_the_engine(
    short_deadline_gateway: GatewayServer, vllm_server: VLLMServer, stream: bool
) -> None:
    """OCRVL_REQUEST_TIMEOUT ends the request (504, or an SSE error event) and frees vLLM."""
    await wait_for_running(vllm_server, lambda n: n == 0, 30)
    headers = {"authorization": f"Bearer {short_deadline_gateway.api_key}"}
    async with httpx.AsyncClient(
        base_url=short_deadline_gateway.url, headers=headers, timeout=60
    ) as client:
        started = time.monotonic()
        response = await client.post(
            "/v1/chat/completions", json=long_generation(vllm_server, stream)
        )
        ended = time.monotonic()
    assert 2.5 <= ended - started < 6
    if stream:
        assert response.status_code == 200
        last_event = response.text.strip().split("\n\n")[-1]
        assert '"code":"timeout"' in last_event
    else:
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "timeout"
    freed = await wait_for_running(vllm_server, lambda n: n == 0, 10)
    assert freed <= FREED_WITHIN, f"vLLM still ran the request {freed:.2f} s after the deadline"
