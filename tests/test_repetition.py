"""Chat and the loop guard (app/repetition.py): relayed unchanged unless a request or the server
asks; asked, a looping answer is stopped and ends with finish_reason "repetition", whole or
streamed."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
LOOPING = "Intro. " + "lorem ipsum " * 600
BODY = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}]}
GUARD = {"x-ocrvl-loop-guard": "on"}


async def ask(fake: FakeVLLM, body: dict[str, Any], **settings: Any) -> list[httpx.Response]:
    """`body` to the gateway, once without the header and once with it."""
    fake.content = LOOPING
    app = create_app(settings_for(fake.url, **settings))
    async with lifespan_client(app, headers={"authorization": f"Bearer {CLIENT_KEY}"}) as client:
        return [
            await client.post("/v1/chat/completions", json=body, headers=headers)
            for headers in ({}, GUARD)
        ]


def events(response: httpx.Response) -> list[Any]:
    """The SSE events of a streamed answer, `[DONE]` as a string."""
    found = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            found.append(data if data == "[DONE]" else orjson.loads(data))
    return found


async def test_chat_is_relayed_unchanged_unless_the_header_asks(fake: FakeVLLM) -> None:
    """Without the header the whole loop comes back as the engine wrote it, unstreamed; with
    `X-OCRVL-Loop-Guard: on` it is streamed from the engine (an event a token as it ships, by
    OCRVL_ENGINE_STREAM_INTERVAL tokens when set), stopped and cut."""
    plain, guarded = await ask(fake, BODY)
    assert plain.json()["choices"][0]["message"]["content"] == LOOPING
    assert "stream" not in fake.bodies[0]
    answer = guarded.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "repetition"
    assert choice["message"]["content"].count("lorem ipsum") == 1
    assert answer["loop"]["unit"] == len("lorem ipsum ")
    assert answer["usage"]["completion_tokens"] == answer["loop"]["tokens"]
    assert fake.bodies[1]["stream"] is True
    assert "stream_interval" not in fake.bodies[1]  # OCRVL_ENGINE_STREAM_INTERVAL's default: 1
    await ask(fake, BODY, engine_stream_interval=8)
    assert "stream_interval" not in fake.bodies[2]  # unguarded: relayed as the client sent it
    assert fake.bodies[3]["stream_interval"] == 8  # the gateway reads it: an event by 8 tokens


async def test_a_streamed_chat_ends_with_the_repetition_event(fake: FakeVLLM) -> None:
    """Streamed with the header: the client gets the text up to the stop, then an event with
    finish_reason "repetition" and `loop`, its usage event (it asked), then [DONE]; no event
    carries the usage the gateway asked of the engine on every chunk."""
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    _, guarded = await ask(fake, body)
    assert guarded.status_code == 200
    got = events(guarded)
    assert got[-1] == "[DONE]"
    usage, last = got[-2], got[-3]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == last["loop"]["tokens"]
    assert last["choices"][0]["finish_reason"] == "repetition"
    assert last["loop"]["unit"] == len("lorem ipsum ")
    deltas = [e for e in got[:-3] if e["choices"]]
    assert all("usage" not in e for e in deltas)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in deltas)
    assert "stream_interval" not in fake.bodies[1]  # the client's stream: token by token
    assert LOOPING.startswith(text)  # what the engine had sent by the stop (the fake sends
    # its events at once; tests/real/test_loop_guard.py bounds the text on a real engine)


async def test_the_setting_guards_every_chat_and_the_header_can_turn_it_off(
    fake: FakeVLLM,
) -> None:
    """OCRVL_CHAT_LOOP_GUARD=on: a request without the header is guarded; `off` is not."""
    fake.content = LOOPING
    app = create_app(settings_for(fake.url, chat_loop_guard="on"))
    async with lifespan_client(app, headers={"authorization": f"Bearer {CLIENT_KEY}"}) as client:
        guarded = await client.post("/v1/chat/completions", json=BODY)
        plain = await client.post(
            "/v1/chat/completions", json=BODY, headers={"x-ocrvl-loop-guard": "off"}
        )
        bad = await client.post(
            "/v1/chat/completions", json=BODY, headers={"x-ocrvl-loop-guard": "maybe"}
        )
    assert guarded.json()["choices"][0]["finish_reason"] == "repetition"
    assert plain.json()["choices"][0]["message"]["content"] == LOOPING
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-ocrvl-loop-guard"


async def test_a_normal_guarded_chat_answers_as_the_engine_did(fake: FakeVLLM) -> None:
    """No loop: the guarded answer's text, finish reason and usage are the engine's."""
    fake.content = "A short answer."
    app = create_app(settings_for(fake.url))
    async with lifespan_client(app, headers={"authorization": f"Bearer {CLIENT_KEY}"}) as client:
        plain = await client.post("/v1/chat/completions", json=BODY)
        guarded = await client.post("/v1/chat/completions", json=BODY, headers=GUARD)
    mine, theirs = guarded.json(), plain.json()
    assert mine["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert mine["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"] == "stop"
    assert mine["usage"] == theirs["usage"]
    assert "loop" not in mine
