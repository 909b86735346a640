"""Request hygiene: what is refused with 400, what is stripped, what passes through untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.pages import paddleocr_body
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "user", "content": "OCR:"}]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b'{"model": "x", "messages": [', None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model", "`model` is required"),
        (b'{"model": 7, "messages": []}', "model", "non-empty string"),
        (b'{"model": "m"}', "messages", "`messages` is required"),
        (b'{"model": "m", "messages": []}', "messages", "non-empty list"),
        (b'{"model": "m", "messages": "OCR:"}', "messages", "non-empty list"),
        (b'{"model": "m", "messages": ["OCR:"]}', "messages[0]", "must be an object"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role", "role is required"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
            "true or false",
        ),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(
    gateway_client: httpx.AsyncClient,
    fake: FakeVLLM,
    body: bytes,
    param: str | None,
    fragment: str,
) -> None:
    """Malformed JSON or a non-chat body: 400 in OpenAI shape with `param`; nothing relayed."""
    response = await gateway_client.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fragment in error["message"]
    assert fake.bodies == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("chat_template", "{{ raise_exception('pwned') }}"),
        ("chat_template_kwargs", {"enable_thinking": True}),
        ("media_io_kwargs", {"image": {"url": "file:///etc/passwd"}}),
    ],
)
async def test_steering_fields_are_refused(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, field: str, value: object
) -> None:
    """chat_template, chat_template_kwargs and media_io_kwargs: 400 naming the field (issue 31:
    refused, no longer stripped silently); nothing reaches vLLM."""
    body = {"model": SERVED, "messages": MESSAGES, field: value}
    response = await gateway_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (field, "operator_only_parameter")
    assert fake.bodies == []


async def test_paddleocr_client_fields_pass_through_unchanged(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """Everything PaddleOCR's pipeline client sends reaches vLLM as sent."""
    body = paddleocr_body(SERVED)
    response = await gateway_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert fake.bodies[-1] == body


async def test_oversize_body_with_content_length_gets_413(
    fake: FakeVLLM,
) -> None:
    """A declared body over OCRVL_MAX_BODY_BYTES: 413 in OpenAI shape, nothing relayed."""
    app = create_app(settings_for(fake.url, max_body_bytes=1000))
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(app, headers=headers) as client:
        big = {"model": SERVED, "messages": MESSAGES, "pad": "x" * 2000}
        declared = await client.post("/v1/chat/completions", json=big)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b" " * 400  # no Content-Length: the gateway counts as it reads

        streamed = await client.post("/v1/chat/completions", content=chunks())
        small = await client.post(
            "/v1/chat/completions", json={"model": SERVED, "messages": MESSAGES}
        )
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert "OCRVL_MAX_BODY_BYTES" in response.json()["error"]["message"]
    assert small.status_code == 200
    assert len(fake.bodies) == 1


@pytest.mark.parametrize(
    ("sent", "relayed"),
    [
        ({"min_pixels": 112896, "max_pixels": 1003520}, None),  # PaddleOCR's own: unchanged
        ({"max_pixels": 50_000_000}, {"max_pixels": 1003520}),
        ({"min_pixels": 9_000_000, "max_pixels": 9_000_000},
         {"min_pixels": 1003520, "max_pixels": 1003520}),
    ],
)  # fmt: skip
async def test_pixel_limits_are_clamped_to_the_models_maximum(
    gateway_client: httpx.AsyncClient,
    fake: FakeVLLM,
    sent: dict[str, int],
    relayed: dict[str, int] | None,
) -> None:
    """mm_processor_kwargs asking for more than OCRVL_MAX_PIXELS reach vLLM clamped."""
    body = {"model": SERVED, "messages": MESSAGES, "mm_processor_kwargs": sent}
    response = await gateway_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert fake.bodies[-1]["mm_processor_kwargs"] == (relayed or sent)
