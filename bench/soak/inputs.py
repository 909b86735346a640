"""What the drill's clients send: page images, small PDFs, and bad inputs.

The bad inputs are examples drawn (seeded, so every run sends the same ones) from the fuzz
tests' own strategy of chat-like bodies (tests/test_chat_fuzz.py's CHATS), plus hand-made
malformed requests the fuzz strategy cannot produce (not JSON, wrong content type, an
oversized image, a broken data URL).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from bench.soak import MAX_PIXELS, MIN_PIXELS, SERVED
from tests.support.documents import pdf
from tests.support.pages import document_page


@dataclass(frozen=True)
class BadInput:
    """One bad (or odd) request: its body and content type."""

    label: str
    body: bytes
    content_type: str = "application/json"


def page_messages(seed: int) -> list[dict[str, Any]]:
    """A page as PaddleOCR's client sends it: the image inline, then the OCR prompt."""
    image = base64.b64encode(document_page(seed, 620, 877)).decode()
    url = f"data:image/png;base64,{image}"
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "OCR:"}]
    return [{"role": "user", "content": content}]


def pixels() -> dict[str, Any]:
    """The `mm_processor_kwargs` PaddleOCR's client sends, at the tiny checkpoint's size."""
    return {"mm_processor_kwargs": {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}}


def documents(count: int, pages: int) -> list[bytes]:
    """`count` different `pages`-page PDFs (page seeds differ between documents)."""
    return [pdf(pages) for _ in range(count)]  # pdf() seeds its pages 0..n-1: same text, fine


def fuzz_bodies(count: int) -> list[BadInput]:
    """`count` bodies drawn, derandomized, from the fuzz tests' CHATS strategy."""
    from hypothesis import HealthCheck, given, settings  # noqa: PLC0415 (bench-only)

    from tests.test_chat_fuzz import CHATS  # noqa: PLC0415

    drawn: list[dict[str, Any]] = []

    @settings(
        max_examples=count, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(CHATS)
    def draw(payload: dict[str, Any]) -> None:
        drawn.append(payload)

    draw()
    return [BadInput(f"fuzz-{i}", json.dumps(p).encode()) for i, p in enumerate(drawn[:count])]


def malformed() -> list[BadInput]:
    """Requests no client should send, each answered with a 4xx in OpenAI's shape."""
    chat = {"model": SERVED, "messages": page_messages(1), "max_tokens": 4}
    broken = json.loads(json.dumps(chat))
    broken["messages"][0]["content"][0]["image_url"]["url"] = "data:image/png;base64,!!!"
    return [
        BadInput("not-json", b"{not json"),
        BadInput("form-body", b"a=1&b=2", "application/x-www-form-urlencoded"),
        BadInput("empty-messages", json.dumps({"model": SERVED, "messages": []}).encode()),
        BadInput("unknown-model", json.dumps({**chat, "model": "no-such-model"}).encode()),
        BadInput("broken-data-url", json.dumps(broken).encode()),
        BadInput("n-too-large", json.dumps({**chat, "n": 50}).encode()),
        BadInput("max-tokens-over-context", json.dumps({**chat, "max_tokens": 10**6}).encode()),
    ]


def bad_inputs(fuzz: int) -> list[BadInput]:
    """The drill's bad inputs: `fuzz` fuzz bodies and the malformed ones."""
    return [*malformed(), *fuzz_bodies(fuzz)]
