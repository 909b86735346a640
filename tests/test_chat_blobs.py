"""Inline images are not parsed: they stay the client's bytes, the payload holds placeholders,
and every rewrite puts the original bytes back."""

from __future__ import annotations

import base64
import json
import os

import orjson
import pytest

from app import chat, policy
from app.errors import InvalidRequest

IMAGE = "data:image/jpeg;base64," + base64.b64encode(os.urandom(30_000)).decode()


def body(**fields: object) -> bytes:
    """A PaddleOCR-style chat body with IMAGE, plus `fields`."""
    payload = {
        "model": "PaddleOCR-VL-1.6-0.9B",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": IMAGE}},
                    {"type": "text", "text": "OCR:"},
                ],
            }
        ],
        "mm_processor_kwargs": {"min_pixels": 112896, "max_pixels": 1003520},
        **fields,
    }
    return json.dumps(payload).encode()  # with spaces, as Python clients send it


def test_the_image_is_left_out_of_the_parsed_form() -> None:
    """The payload holds a short data: placeholder; the raw body is the client's, untouched."""
    raw = body()
    parsed = chat.parse(raw)
    url = parsed.payload["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:")
    assert len(url) < 100
    assert parsed.for_backend("PaddleOCR-VL-1.6-0.9B", 1_003_520) is raw


@pytest.mark.parametrize(
    ("fields", "priority"),
    [({}, None), ({}, 5), ({"mm_processor_kwargs": {"max_pixels": 10**8}}, None)],
    ids=["alias", "gateway-edit", "clamped-pixels"],
)
def test_a_rewritten_body_carries_the_original_image_bytes(
    fields: dict[str, object], priority: int | None
) -> None:
    """Alias rewrite, a gateway edit (policy.with_priority), clamped pixels: the body sent is the
    full request with the served name, and the image is byte for byte the client's."""
    raw = body(**fields)
    parsed = chat.parse(raw)
    if priority is not None:
        policy.with_priority(parsed, priority)
    sent = parsed.for_backend("served-name", 1_003_520)
    decoded = orjson.loads(sent)
    assert decoded["model"] == "served-name"
    assert decoded["messages"][0]["content"][0]["image_url"]["url"] == IMAGE
    assert decoded.get("priority") == priority
    assert decoded["mm_processor_kwargs"]["max_pixels"] <= 1_003_520
    assert IMAGE.encode() in sent


def test_an_image_replaced_in_the_payload_disappears_cleanly() -> None:
    """A placeholder the payload no longer holds (the image was replaced, as a resize does)
    leaves no trace of the original image; the rest stays valid."""
    parsed = chat.parse(body())
    parsed.payload["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64,AA"
    parsed.edited = True
    sent = parsed.for_backend("PaddleOCR-VL-1.6-0.9B", 1_003_520)
    decoded = orjson.loads(sent)
    assert decoded["messages"][0]["content"][0]["image_url"]["url"] == "data:image/png;base64,AA"
    assert IMAGE.encode() not in sent


def test_a_data_string_with_escaped_quotes_is_parsed_whole() -> None:
    """A long data: string that is not plain (an escaped quote inside) is parsed as usual."""
    odd = "data:text/plain," + 'a"b' * 3000
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": odd}]}).encode()
    parsed = chat.parse(raw)
    assert parsed.blobs is None
    assert parsed.payload["messages"][0]["content"] == odd


def test_data_mentioned_inside_text_is_left_alone() -> None:
    """`"data:` inside a text string (its quote escaped) is not mistaken for an image."""
    text = 'the field "data:x" ' + "y" * 5000
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    assert chat.parse(raw).payload["messages"][0]["content"] == text


def test_broken_json_around_an_image_is_still_a_400() -> None:
    """Leaving the image out does not let a malformed body through."""
    raw = body()[:-1]
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        chat.parse(raw)


def test_the_request_gives_up_its_copies_once_the_body_is_taken() -> None:
    """After take_body the request holds neither the raw body nor the parsed form."""
    parsed = chat.parse(body())
    sent = parsed.take_body("served-name", 1_003_520)
    assert IMAGE.encode() in sent
    assert (parsed.raw, parsed.payload) == (b"", {})
