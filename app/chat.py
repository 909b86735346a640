"""The chat completion request as the gateway sees it: checked, cleaned, ready to relay."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import InvalidRequest

BLOB_MIN = 4096  # a string this long that starts with "data:" is an inline image
_BLOB_START = b'"data:'


@dataclass(frozen=True, slots=True)
class Blobs:
    """A body's inline images, left out of its parsed form: each one's span in the raw body,
    and the placeholder string that stands for it in the parsed form (`{tag}{index}`)."""

    spans: tuple[tuple[int, int], ...]
    tag: str


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat completion body: its bytes and, until `take_body`, its parsed form."""

    payload: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    blobs: Blobs | None = None  # inline images the payload holds only as placeholders
    pages: int = 1  # sequences it makes the engine decode at once (`n`), set by app/policy.py
    units: int | None = None  # its work in admission (app/scheduling); None: `pages` pages
    edited: bool = False  # the payload was changed in place since `raw` (app/policy.py)

    def take_body(self, served_model: str, max_pixels: int) -> bytes:
        """`for_backend`'s body, and the request gives up its own copies (raw and parsed).

        A page is big (a 1 MB image is a 1 MB string once parsed) and may wait long in the
        admission queue: from here on it costs the gateway one copy of its bytes, the one that
        is sent (and kept for a replay until the backend has answered).
        """
        body = self.for_backend(served_model, max_pixels)
        self.payload, self.raw = {}, b""
        return body

    def for_backend(self, served_model: str, max_pixels: int) -> bytes:
        """The body to send upstream: the served model name, the policy's edits (app/policy.py
        has judged every field), and `mm_processor_kwargs` pixel limits clamped to `max_pixels`."""
        pixels = _clamped_pixels(self.payload.get("mm_processor_kwargs"), max_pixels)
        if served_model == self.model and pixels is None and not self.edited:
            return self.raw  # the common case costs no re-encoding
        cleaned = dict(self.payload)
        cleaned["model"] = served_model
        if pixels is not None:
            cleaned["mm_processor_kwargs"] = pixels
        return self.encode(cleaned)

    def encode(self, payload: dict[str, Any]) -> bytes:
        """`payload` as JSON, each image placeholder replaced by the image's original bytes."""
        encoded = orjson.dumps(payload)
        if self.blobs is None:
            return encoded
        pieces, position = [], 0
        for index, (start, end) in enumerate(self.blobs.spans):
            placeholder = f'"{self.blobs.tag}{index}"'.encode()
            found = encoded.find(placeholder, position)
            if found < 0:  # the image was in a field that was dropped
                continue
            pieces += [encoded[position : found + 1], self.raw[start:end]]
            position = found + len(placeholder) - 1
        pieces.append(encoded[position:])
        return b"".join(pieces)

    def inline_string(self, value: str) -> str:
        """`value` from the payload, or the whole image it stands for when it is a placeholder."""
        if self.blobs is None or not value.startswith(self.blobs.tag):
            return value
        start, end = self.blobs.spans[int(value[len(self.blobs.tag) :])]
        text = self.raw[start:end].decode(errors="replace")
        return text.replace("\\/", "/")  # JSON may escape "/", which base64 holds

    def inline_head(self, value: str, chars: int) -> str:
        """The first `chars` characters of `value`, or of the image it stands for, without
        copying the rest of it out of `raw`."""
        if self.blobs is None or not value.startswith(self.blobs.tag):
            return value[:chars]
        start, end = self.blobs.spans[int(value[len(self.blobs.tag) :])]
        text = self.raw[start : min(end, start + chars)].decode(errors="replace")
        return text.replace("\\/", "/")

    def rewritten(self) -> ChatRequest:
        """The request again, from its payload as changed in place (images inlined)."""
        again = parse(self.encode(self.payload))
        again.pages = self.pages
        again.units = self.units
        return again


def content_parts(payload: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object in a message's content list, with where it is (`messages[0].content[1]`)."""
    messages = payload.get("messages")
    for m, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict):
                yield f"messages[{m}].content[{p}]", part


def _clamped_pixels(kwargs: object, max_pixels: int) -> dict[str, Any] | None:
    """`kwargs` with min/max_pixels held to `max_pixels`, or None when nothing changes.

    A client asking for more pixels than the model's own maximum would make the vision encoder
    use memory the profile never budgeted for (one page can then take the whole GPU).
    """
    if not isinstance(kwargs, dict):
        return None
    clamped = dict(kwargs)
    for name in ("max_pixels", "min_pixels"):
        value = clamped.get(name)
        if isinstance(value, int | float) and value > max_pixels:
            clamped[name] = max_pixels
    return clamped if clamped != kwargs else None


def parse(raw: bytes) -> ChatRequest:
    """Check that `raw` is a chat completion request; 400 naming the field otherwise.

    Inline images (long `data:` strings) are not parsed: the gateway needs only their scheme,
    and parsing a 1 MB image into a 1 MB string costs time and a second copy. They stay bytes
    in `raw`, placeholders in the payload, and go to vLLM as the client sent them; the gateway
    reads only each one's header (app/images.py: size, shape, format) before it is sent.
    """
    outline = _outline(raw)
    blobs = None
    try:
        if outline is not None:
            try:
                payload, blobs = orjson.loads(outline[0]), outline[1]
            except orjson.JSONDecodeError:  # the outline was no help: parse it all
                payload = orjson.loads(raw)
        else:
            payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest(
            f"the request body must be a JSON object; got a JSON {type(payload).__name__}"
        )
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a non-empty string", param="model")
    _check_messages(payload.get("messages"))
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be true or false", param="stream")
    return ChatRequest(payload=payload, raw=raw, model=model, stream=stream, blobs=blobs)


def _outline(raw: bytes) -> tuple[bytes, Blobs] | None:
    """`raw` with each long `data:` string swapped for a short placeholder, or None when it
    has none (or one that is not a plain string, e.g. holding escaped quotes)."""
    spans = []
    at = raw.find(_BLOB_START)
    while at >= 0:
        end = raw.find(b'"', at + 1)
        if end < 0:
            return None
        if end - at - 1 >= BLOB_MIN and not _escaped(raw, at):
            if raw[end - 1] == ord("\\"):  # an escaped quote inside: not a plain image string
                return None
            spans.append((at + 1, end))
        at = raw.find(_BLOB_START, end + 1)
    if not spans:
        return None
    tag = f"data:,ocrvl-{secrets.token_hex(8)}-"
    pieces, position = [], 0
    for index, (start, end) in enumerate(spans):
        pieces += [raw[position:start], f"{tag}{index}".encode()]
        position = end
    pieces.append(raw[position:])
    return b"".join(pieces), Blobs(tuple(spans), tag)


def _escaped(raw: bytes, quote: int) -> bool:
    """Whether the quote at `quote` is escaped (an odd run of backslashes before it)."""
    backslashes = 0
    while quote - backslashes - 1 >= 0 and raw[quote - backslashes - 1] == ord("\\"):
        backslashes += 1
    return backslashes % 2 == 1


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            "`messages` is required: a non-empty list of {role, content} objects",
            param="messages",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"messages[{i}] must be an object with `role` and `content`",
                param=f"messages[{i}]",
            )
        if not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"messages[{i}].role is required and must be a string such as 'user'",
                param=f"messages[{i}].role",
            )
