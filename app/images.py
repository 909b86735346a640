"""Chat images: checked by the gateway (always), brought to the model's size (OCRVL_RESIZE_IMAGES).

`check` reads each inline image's header only (the size fields of a PNG, a JPEG or a WebP; any
other format by Pillow's lazy open: no pixel decoded; the first KiB of its base64, more only for
a header that lies further in, behind EXIF say) and refuses what the model cannot take with the
rules /v1/ocr, jobs and batches share (app/documents/resize.py): too many pixels, over 200:1,
not an image at all, not base64. Before this, such an image went to vLLM, whose 400 named
Python objects.

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
import base64
import io
import re
import warnings
from collections.abc import Iterator
from typing import Any

from PIL import Image, UnidentifiedImageError

from app.chat import ChatRequest, content_parts
from app.documents import resize
from app.documents.errors import DocumentError
from app.documents.workers import Preprocessor
from app.errors import InvalidRequest
from app.settings import Settings

HEADS = (1024, 96 * 1024)  # base64 characters tried for the header before the whole image
BASE64_NOISE = re.compile(r"[^A-Za-z0-9+/]")  # JSON escapes, line breaks, padding: no data
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOFn: not DHT, JPG, DAC


class ChatImages:
    """Checks a chat request's inline images; resizes them in the page workers when on."""

    def __init__(self, settings: Settings, workers: Preprocessor) -> None:
        self.enabled = settings.resize_images == "on"
        self._max_pixels = settings.max_pixels
        self._max_decoded = settings.max_page_pixels
        self._workers = workers

    def check(self, chat: ChatRequest) -> None:
        """400 naming the image for one the model cannot take (the rules every route shares),
        from its header: before a byte of the request is sent."""
        for place, part in content_parts(chat.payload):
            holder = part.get("image_url")
            url = holder.get("url") if isinstance(holder, dict) else holder
            if not isinstance(url, str) or not url.startswith("data:"):
                continue  # not inline: refused or fetched and inlined first (app/media.py)
            where = f"{place}.image_url"
            try:
                width, height = _size(chat, url, where)
                resize.check_pixels(
                    where, width, height, self._max_decoded, "scale it down before sending"
                )
                resize.check_shape(where, width, height)
            except DocumentError as exc:
                raise InvalidRequest(exc.message, param=where, code=exc.code) from None

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


def _size(chat: ChatRequest, url: str, where: str) -> tuple[int, int]:
    """The inline image's (width, height) from its header; DocumentError when it has none."""
    head, comma, _ = chat.inline_head(url, 512).partition(",")
    if not comma or not head.endswith(";base64"):
        raise DocumentError(
            f"{where} must be a base64 data: URL (data:image/png;base64,...)", "invalid_image"
        )
    start = len(head) + 1
    for chars in (*HEADS, None):
        text = chat.inline_string(url) if chars is None else chat.inline_head(url, start + chars)
        size = _header_size(text[start:])
        if size is not None:
            return size
        if chars is not None and len(text) < start + chars:
            break  # that was the whole image already
    raise DocumentError(
        f"{where} is not an image the model can read: no image format recognises its bytes",
        "invalid_image",
    )


def _header_size(base64_text: str) -> tuple[int, int] | None:
    """(width, height) from the (start of the) image's header, or None. PNG, JPEG and WebP
    are read here (their size fields: a few bytes), any other format by Pillow's lazy open."""
    data = _decoded(base64_text)
    for signature, reader in SIZE_READERS:
        if data.startswith(signature):
            return reader(data)
    default_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # the size is ours
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
        return None  # not an image, or its header goes on past these bytes
    finally:
        Image.MAX_IMAGE_PIXELS = default_limit


def _png_size(data: bytes) -> tuple[int, int] | None:
    """IHDR's width and height (the first chunk, bytes 16-24)."""
    if data[12:16] != b"IHDR" or len(data) < 24:
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _webp_size(data: bytes) -> tuple[int, int] | None:
    """The canvas (VP8X) or the frame (VP8, VP8L) size of a WebP."""
    kind = data[12:16]
    if data[8:12] != b"WEBP" or len(data) < 30:
        return None
    if kind == b"VP8X":
        wide, high = data[24:27], data[27:30]
        return 1 + int.from_bytes(wide, "little"), 1 + int.from_bytes(high, "little")
    if kind == b"VP8 ":
        wide, high = data[26:28], data[28:30]
        return int.from_bytes(wide, "little") & 0x3FFF, int.from_bytes(high, "little") & 0x3FFF
    if kind == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _decoded(base64_text: str) -> bytes:
    """The bytes of (the start of) a base64 string; whatever is no base64 is left out."""
    cut = base64_text[: len(base64_text) - len(base64_text) % 4]
    try:
        return base64.b64decode(cut)
    except ValueError:  # JSON escapes or line breaks inside: read past them
        clean = BASE64_NOISE.sub("", base64_text)
        return base64.b64decode(clean[: len(clean) - len(clean) % 4])


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header (SOFn), walking the markers before it; None
    when it lies past these bytes or the markers are broken."""
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
        elif marker in JPEG_FRAMES:
            return int.from_bytes(data[at + 7 : at + 9], "big"), int.from_bytes(
                data[at + 5 : at + 7], "big"
            )
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length of their own
            at += 2
        else:
            at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


SIZE_READERS = ((PNG_SIGNATURE, _png_size), (b"\xff\xd8", _jpeg_size), (b"RIFF", _webp_size))


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
