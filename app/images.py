"""Chat images brought to the model's size by the gateway (OCRVL_RESIZE_IMAGES=on).

vLLM's API server decodes every page and resizes it to PaddleOCR-VL's pixel budget on one
renderer thread, which an H200 engine keeps three quarters busy; a page already at that size
halves its work (0.48x: bench/results/renderer-2026-12-01.md). With this on, the page workers of
/v1/ocr do the resize: each inline image of a request that carries `min_pixels` and `max_pixels` in
`mm_processor_kwargs` (as PaddleOCR's client always does) becomes a JPEG q95 at exactly the size
vLLM's processor would pick for those bounds (max clamped as the relay clamps it), so the engine
sees the same grid and its own resize changes nothing. An image that needs no shrinking, or that
the gateway cannot decode, goes as the client sent it: vLLM decides about it as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from app.chat import ChatRequest, content_parts
from app.documents import resize
from app.documents.errors import DocumentError
from app.documents.workers import Preprocessor
from app.settings import Settings


class ChatImages:
    """Resizes a chat request's inline images in the page workers, when switched on."""

    def __init__(self, settings: Settings, workers: Preprocessor) -> None:
        self.enabled = settings.resize_images == "on"
        self._max_pixels = settings.max_pixels
        self._max_decoded = settings.max_page_pixels
        self._workers = workers

    async def fit(self, chat: ChatRequest) -> tuple[ChatRequest, int]:
        """`chat` with its inline images at the model's size, and how many were resized."""
        if not self.enabled:
            return chat, 0
        bounds = _bounds(chat.payload.get("mm_processor_kwargs"), self._max_pixels)
        if bounds is None:
            return chat, 0  # the checkpoint's own bounds apply: the gateway does not guess them
        slots = list(_image_slots(chat.payload))
        if not slots:
            return chat, 0
        urls = [chat.inline_string(url) for _, url in slots]
        try:
            smaller = await asyncio.gather(
                *(self._workers.run(resize.shrink_data_url, url, *bounds, self._max_decoded)
                  for url in urls)
            )  # fmt: skip
        except DocumentError:
            return chat, 0  # a worker died (its pool is replaced): the originals go on
        resized = 0
        for (holder, _), url in zip(slots, smaller, strict=True):
            if url is not None:
                holder["url"] = url
                resized += 1
        return (chat.rewritten() if resized else chat), resized


def _bounds(kwargs: object, cap: int) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) as the engine will apply them, or None if either is missing."""
    if not isinstance(kwargs, dict):
        return None
    low, high = kwargs.get("min_pixels"), kwargs.get("max_pixels")
    if type(low) is not int or type(high) is not int:  # bools and floats: left to vLLM
        return None
    high, low = min(high, cap), min(low, cap)  # as the relay clamps them (chat._clamped_pixels)
    return (low, high) if 0 < low <= high else None


def _image_slots(payload: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """Each `image_url` object whose URL is inline, with that URL (or its placeholder)."""
    for _, part in content_parts(payload):
        holder = part.get("image_url")
        if not isinstance(holder, dict):
            continue  # no image, or the bare-string form: sent as it is
        url = holder.get("url")
        if isinstance(url, str) and url.startswith("data:"):
            yield holder, url
