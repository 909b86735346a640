"""Synthetic document pages and the chat bodies real clients send with them."""

from __future__ import annotations

import base64
import io
import random
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from app.bench.corpus import WORDS as CORPUS_WORDS

WORDS = tuple(CORPUS_WORDS[:24])  # the benchmark corpus's first words: pages stay as they were


def document_page(
    seed: int = 0, width: int = 1240, height: int = 1754, fmt: str = "JPEG", quality: int = 85
) -> bytes:
    """An A4-like page (150 dpi by default) of seeded random text lines, encoded as `fmt`."""
    rng = random.Random(seed)
    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=max(12, width // 60))
    y = height // 20
    while y < height - height // 20:
        words = rng.choices(WORDS, k=rng.randint(4, 12))
        draw.text((width // 12, y), " ".join(words), fill="black", font=font)
        if rng.random() < 0.1:  # a table rule now and then, as in real documents
            draw.line((width // 12, y - 4, width - width // 12, y - 4), fill="black", width=2)
        y += int(font.size * 1.6)
    out = io.BytesIO()
    page.save(out, format=fmt, quality=quality) if fmt == "JPEG" else page.save(out, format=fmt)
    return out.getvalue()


def data_url(image: bytes, mime: str = "image/jpeg") -> str:
    """`image` as a base64 data: URL, as PaddleOCR's client and the OpenAI SDK send it."""
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def chat_body(
    image: bytes, prompt: str = "OCR:", model: str = "PaddleOCR-VL-1.5-0.9B",
    mime: str = "image/jpeg", **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """A chat completion body shaped like PaddleOCR's pipeline client's (see shared/CLIENTS.md)."""
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image, mime)}},
                    {"type": "text", "text": prompt},
                ],
            }
        ],
        **extra,
    }


def _stub_jpeg() -> str:
    """A small real JPEG as a data URL: the gateway reads every image's header."""
    out = io.BytesIO()
    Image.new("RGB", (64, 32), "white").save(out, format="JPEG")
    return data_url(out.getvalue())


STUB_JPEG = _stub_jpeg()


def paddleocr_body(model: str) -> dict[str, Any]:
    """Exactly what PaddleOCR's pipeline client sends for one page (shared/CLIENTS.md), with a
    stub JPEG: the fields and values real pages carry."""
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": STUB_JPEG}},
                    {"type": "text", "text": "OCR:"},
                ],
            }
        ],
        "max_completion_tokens": 4096,
        "temperature": 0,
        "top_p": 1.0,
        "repetition_penalty": 1.05,
        "skip_special_tokens": True,
        "mm_processor_kwargs": {"min_pixels": 112896, "max_pixels": 1003520},
    }
