"""Property tests: no body, however malformed, gets anything but a 2xx or an OpenAI-shaped 4xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import chat, policy
from app.errors import InvalidRequest
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import ThreadedServer

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)
POLICY_FIELDS = (
    "n", "stop", "top_logprobs", "response_format", "structured_outputs", "tools", "tool_choice",
    "guided_regex", "priority", "max_completion_tokens", "logit_bias",
)  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | JSON},
    optional={"content": JSON},
)
CHATS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([SERVED, "PaddleOCR-VL", "unknown-model", ""]) | JSON,
        "messages": st.lists(MESSAGE | JSON, max_size=3) | JSON,
        "stream": st.booleans() | JSON,
        "chat_template": st.text(),
        "mm_processor_kwargs": st.dictionaries(
            st.sampled_from(["min_pixels", "max_pixels"]), st.integers() | JSON
        ),
        "max_tokens": st.integers(min_value=1, max_value=64),
        # the request policy's fields (app/policy.py): passed, capped or refused, never a 5xx
        **dict.fromkeys(POLICY_FIELDS, st.integers(min_value=-2, max_value=5000) | JSON),
    },
)
POLICY_SETTINGS = settings_for("http://127.0.0.1:9")


@given(st.binary(max_size=300) | JSON.map(lambda value: json.dumps(value).encode()))
def test_parse_accepts_or_names_the_problem(raw: bytes) -> None:
    """Any bytes either parse into a chat request or raise InvalidRequest, nothing else."""
    try:
        parsed = chat.parse(raw)
    except InvalidRequest as error:
        problem: InvalidRequest | None = error
    else:
        problem = None
    if problem is not None:
        assert problem.status == 400
        assert problem.message
    else:
        assert isinstance(parsed.payload["messages"], list)
        assert parsed.payload["messages"]


@given(CHATS)
def test_relayed_bodies_are_clean_json(payload: dict[str, Any]) -> None:
    """What goes upstream is JSON with the served name, no operator-only field, pixels capped."""
    try:
        parsed = policy.apply(chat.parse(json.dumps(payload).encode()), POLICY_SETTINGS, None)
    except InvalidRequest:
        return
    upstream = orjson.loads(parsed.for_backend(SERVED, 1_003_520))
    assert upstream["model"] == SERVED
    assert not set(policy.OPERATOR) & set(upstream)
    pixels = upstream.get("mm_processor_kwargs")
    if isinstance(pixels, dict):
        for value in pixels.values():
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert value <= 1_003_520


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """A real-socket gateway in front of FakeVLLM, shared by the examples of one property."""
    backend = FakeVLLM()
    with ThreadedServer(backend) as upstream:
        app = create_app(settings_for(upstream.url))
        with ThreadedServer(app) as gateway:
            yield gateway.url


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(CHATS)
def test_gateway_answers_every_body_without_a_server_error(
    gateway_url: str, payload: dict[str, Any]
) -> None:
    """Random chat-like bodies get 200, or a 4xx in OpenAI's shape; never a 5xx."""
    response = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        content=json.dumps(payload),
        headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code in (200, 400, 404), response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
