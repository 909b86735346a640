"""OCRVL_RESIZE_IMAGES: chat images at the model's size, made in the page workers.

In-process gateway in front of the fake backend (a fake only because the bodies it received
are what is checked; tests/real/test_resize_images.py sends the same pages to real vLLM).
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from PIL import Image

from app.documents.resize import smart_resize
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
LOW, HIGH = 112_896, 1_003_520  # what PaddleOCR's client sends
PAGE = (1240, 1754)  # A4 at 150 dpi


def jpeg_url(width: int, height: int) -> str:
    out = io.BytesIO()
    page = Image.new("RGB", (width, height), "white")
    page.paste((0, 0, 0), (100, 100, 700, 140))  # a line of "text"
    page.save(out, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def body(url: str, **fields: Any) -> bytes:
    """PaddleOCR's client's body for one page, with `fields` set or (None) removed."""
    payload: dict[str, Any] = {
        "model": SERVED,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "OCR:"},
        ]}],
        "max_completion_tokens": 4096, "temperature": 0, "skip_special_tokens": True,
        "mm_processor_kwargs": {"min_pixels": LOW, "max_pixels": HIGH},
    }  # fmt: skip
    payload.update(fields)
    return json.dumps({k: v for k, v in payload.items() if v is not None}).encode()


def sent_image(fake: FakeVLLM) -> str:
    url: str = fake.bodies[-1]["messages"][0]["content"][0]["image_url"]["url"]
    return url


def size_of(url: str) -> tuple[int, int]:
    image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    return image.size


@pytest.fixture
async def resizing(fake: FakeVLLM) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway with OCRVL_RESIZE_IMAGES=on in front of `fake`."""
    app = create_app(settings_for(fake.url, resize_images="on", preprocess_workers=1))
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"}
    async with lifespan_client(app, headers=headers) as client:
        yield client


async def test_a_page_reaches_vllm_at_the_size_its_processor_would_pick(
    resizing: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A 150-dpi page goes on as a JPEG at smart_resize of its size; the rest of the body is
    the client's."""
    response = await resizing.post("/v1/chat/completions", content=body(jpeg_url(*PAGE)))
    assert response.status_code == 200
    width, height = size_of(sent_image(fake))
    assert (height, width) == smart_resize(PAGE[1], PAGE[0], LOW, HIGH)
    assert (width, height) != PAGE
    sent = fake.bodies[-1]
    assert sent["mm_processor_kwargs"] == {"min_pixels": LOW, "max_pixels": HIGH}
    assert sent["messages"][0]["content"][1] == {"type": "text", "text": "OCR:"}
    assert sent["max_completion_tokens"] == 4096


async def test_max_pixels_over_the_cap_shrink_to_the_capped_budget(
    resizing: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A request asking for more than OCRVL_MAX_PIXELS gets the page at the capped budget,
    matching the clamped max_pixels the relay sends on."""
    url = jpeg_url(3508, 4961)  # A4 at 300 dpi
    kwargs = {"min_pixels": LOW, "max_pixels": 10**8}
    response = await resizing.post(
        "/v1/chat/completions", content=body(url, mm_processor_kwargs=kwargs)
    )
    assert response.status_code == 200
    width, height = size_of(sent_image(fake))
    assert (height, width) == smart_resize(4961, 3508, LOW, HIGH)
    assert fake.bodies[-1]["mm_processor_kwargs"] == {"min_pixels": LOW, "max_pixels": HIGH}


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        pytest.param({"mm_processor_kwargs": None}, None, id="no-pixel-bounds"),
        pytest.param({"mm_processor_kwargs": {"max_pixels": HIGH}}, None, id="no-min-pixels"),
        pytest.param({}, jpeg_url(812, 1176), id="already-at-the-size"),
    ],
)  # fmt: skip
async def test_images_the_gateway_leaves_alone_go_byte_for_byte(
    resizing: httpx.AsyncClient, fake: FakeVLLM, fields: dict[str, Any], url: str | None
) -> None:
    """No min/max pixels (the checkpoint's own bounds apply) or a page already at its size: the
    client's data URL reaches vLLM unchanged (bytes that are no image are refused before:
    tests/test_image_rules.py)."""
    url = url or jpeg_url(*PAGE)
    response = await resizing.post("/v1/chat/completions", content=body(url, **fields))
    assert response.status_code == 200
    assert sent_image(fake) == url


async def test_off_by_default_the_client_image_goes_as_sent(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """Without OCRVL_RESIZE_IMAGES the page is the client's, byte for byte."""
    url = jpeg_url(*PAGE)
    response = await gateway_client.post(
        "/v1/chat/completions", content=body(url), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert sent_image(fake) == url
