"""vLLM's own validation errors reach the client in OpenAI's shape through the gateway."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.conftest import GatewayServer
from tests.support.pages import data_url, document_page

pytestmark = pytest.mark.vllm


def image_body(url: str, **extra: object) -> dict[str, object]:
    """A one-image `OCR:` chat body."""
    return {
        "model": "PaddleOCR-VL-1.5-0.9B",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "OCR:"},
                ],
            }
        ],
        "max_tokens": 4,
        **extra,
    }


PAGE = data_url(document_page(0, width=200, height=280, fmt="PNG"), "image/png")
NOT_AN_IMAGE = "data:image/png;base64," + base64.b64encode(b"this is not a PNG at all").decode()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (image_body("data:image/png;base64,@@@not-base64@@@"), None, "base64"),
        (image_body(NOT_AN_IMAGE), None, "image"),
        (image_body(PAGE, max_tokens=10**6), "max_tokens", "max_model_len"),
    ],
    ids=["broken-base64", "not-an-image", "max-tokens-over-limit"],
)  # fmt: skip
def test_engine_rejections_are_400_in_openai_shape(
    gateway: GatewayServer,
    body: dict[str, object],
    param: str | None,
    fragment: str,
    stream: bool,
) -> None:
    """Each bad input is vLLM's 400, passed on with its message and `param`."""
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**body, "stream": stream},
        headers={"authorization": f"Bearer {gateway.api_key}"},
        timeout=60,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert fragment in error["message"].lower()
    # the gateway and the engine keep serving
    assert httpx.get(f"{gateway.url}/ready", timeout=5).status_code == 200
