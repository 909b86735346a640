"""The loop guard on the real engine: a request pinned to one token is stopped within the guard's
window, and vLLM's own counter says it generated no more than that; a normal request is the same
with the guard on as off."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import orjson
import pytest

from app.documents import loops
from tests.conftest import GatewayServer, VLLMServer, _stop, start_gateway

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
ELLIPSIS = 177  # the tiny model's token for "…" (one character a token)
GUARD = {"x-ocrvl-loop-guard": "on"}
# the guard looks every CHECK_EVERY characters; vLLM may decode a few tokens more before the
# gateway's close reaches it and it aborts the request
SLACK = loops.CHECK_EVERY + 32
STREAM_INTERVAL = 8  # the by-8 gateway's OCRVL_ENGINE_STREAM_INTERVAL: its answers' events


@pytest.fixture(scope="module")
def gateway_by_8(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real gateway in front of the session's vLLM that asks it for an event every 8 tokens
    on the streams it reads itself (the default is an event a token)."""
    server = start_gateway(vllm_server, tmp_path_factory.mktemp("gw-by-8"), ("sk-by-8",),
                           OCRVL_ENGINE_STREAM_INTERVAL=str(STREAM_INTERVAL))  # fmt: skip
    yield server
    _stop(server.process)


def body(vllm: VLLMServer, max_tokens: int, **extra: object) -> dict[str, object]:
    return {
        "model": vllm.served_model_name,
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


async def chat(
    gateway: GatewayServer, request: dict[str, object], headers: dict[str, str]
) -> httpx.Response:
    """POST `request` to the gateway's /v1/chat/completions with its key and `headers`."""
    async with httpx.AsyncClient(timeout=300) as client:
        return await client.post(
            f"{gateway.url}/v1/chat/completions",
            json=request,
            headers={"authorization": f"Bearer {gateway.api_key}", **headers},
        )


async def generated(vllm: VLLMServer) -> float:
    """vLLM's own count of the tokens it has generated (`vllm:generation_tokens_total`)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{vllm.url}/metrics", timeout=10)).text
    found = re.findall(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    assert found, "vLLM's /metrics has no vllm:generation_tokens_total"
    return sum(float(value) for value in found)


@pytest.mark.parametrize("by_8", [False, True], ids=["as-shipped", "by-8"])
async def test_a_request_forced_to_loop_is_stopped_within_the_window(
    gateway: GatewayServer, vllm_server: VLLMServer, by_8: bool, request: pytest.FixtureRequest
) -> None:
    """logit_bias pins `…`: with the guard on the answer stops at the guard's window (640
    characters of `…`, one token each), finish_reason "repetition", the text cut to one `…`;
    vLLM generated no more than the window, not the request's 3,000 tokens. Through the by-8
    gateway the answer came as events of 8 tokens (`stream_interval`), and vLLM sent them so."""
    window = loops.TEXT.need(1)
    through = request.getfixturevalue("gateway_by_8") if by_8 else gateway
    before = await generated(vllm_server)
    forced = body(vllm_server, 3000, logit_bias={str(ELLIPSIS): 100}, ignore_eos=True)
    response = await chat(through, forced, GUARD)
    assert response.status_code == 200, response.text
    answer = response.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "repetition"
    assert choice["message"]["content"] == "…"
    assert answer["loop"]["unit"] == 1
    spent = answer["usage"]["completion_tokens"]
    assert window <= spent <= window + loops.CHECK_EVERY
    assert answer["loop"]["tokens"] == spent
    if by_8:
        assert spent % STREAM_INTERVAL == 1  # vLLM's events: the first token, then 8 at a time
    after = await generated(vllm_server)
    print(f"by 8 {by_8}: window {window}, answer's tokens {spent}, vLLM generated "
          f"{after - before:g}")  # fmt: skip
    assert after - before <= window + SLACK  # vLLM's own count: not the 3,000 asked for


async def test_a_streamed_request_forced_to_loop_ends_with_the_repetition_event(
    gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """Streamed, the same request gets the `…` events the engine sent up to the stop (the
    window), then finish_reason "repetition", its usage event and [DONE]; vLLM generated no
    more than the window."""
    window = loops.TEXT.need(1)
    before = await generated(vllm_server)
    forced = body(
        vllm_server, 3000, logit_bias={str(ELLIPSIS): 100}, ignore_eos=True, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    response = await chat(gateway, forced, GUARD)
    assert response.status_code == 200, response.text
    events = [block[6:] for block in response.text.split("\n\n") if block.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last, usage = orjson.loads(events[-3]), orjson.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "repetition"
    assert usage["usage"]["completion_tokens"] == last["loop"]["tokens"]
    text = "".join(
        (orjson.loads(e)["choices"] or [{"delta": {}}])[0]["delta"].get("content") or ""
        for e in events[:-3]
    )
    assert set(text) == {"…"}
    assert window <= len(text) <= window + loops.CHECK_EVERY
    assert await generated(vllm_server) - before <= window + SLACK


async def test_a_normal_request_is_the_same_with_the_guard_on_and_off(
    gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """Greedy decoding, no loop within its tokens: the guarded answer's text, finish reason
    and usage are the unguarded answer's."""
    plain = body(vllm_server, 200)
    answers = []
    for headers in ({}, GUARD):
        response = await chat(gateway, plain, headers)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    unguarded, guarded = answers
    assert "loop" not in guarded
    assert (
        guarded["choices"][0]["message"]["content"] == unguarded["choices"][0]["message"]["content"]
    )
    assert guarded["choices"][0]["finish_reason"] == unguarded["choices"][0]["finish_reason"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [guarded["usage"][n] for n in counts] == [unguarded["usage"][n] for n in counts]
