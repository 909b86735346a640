"""What the engine would refuse reaches the client in the gateway's own shape: refused by the
gateway before it is sent (images, max_tokens), or vLLM's 400 rewritten (tests/test_proxy.py)."""

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


IMAGE = "messages[0].content[0].image_url"
WIDE = data_url(document_page(0, width=10_000, height=28, fmt="PNG"), "image/png")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("body", "param", "code", "fragment"),
    [
        (image_body("data:image/png;base64,@@@not-base64@@@"), IMAGE, "invalid_image", "image"),
        (image_body(NOT_AN_IMAGE), IMAGE, "invalid_image", "image"),
        (image_body(WIDE), IMAGE, "aspect_ratio", "200:1"),
        (image_body(PAGE, max_tokens=10**6), "max_tokens", "integer_above_max_value",
         "max_model_len"),
    ],
    ids=["broken-base64", "not-an-image", "too-wide", "max-tokens-over-limit"],
)  # fmt: skip
def test_engine_rejections_are_400_in_openai_shape(
    gateway: GatewayServer,
    body: dict[str, object],
    param: str | None,
    code: str,
    fragment: str,
    stream: bool,
) -> None:
    """Each input the engine would refuse is the gateway's own 400, before it is sent: its
    `param` and `code`, words that say what to do, no Python object names."""
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**body, "stream": stream},
        headers={"authorization": f"Bearer {gateway.api_key}"},
        timeout=60,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert fragment in error["message"].lower()
    assert "<" not in error["message"]  # no <PIL.Image.Image …> or <_io.BytesIO …>
    # the gateway and the engine keep serving
    assert httpx.get(f"{gateway.url}/ready", timeout=5).status_code == 200
