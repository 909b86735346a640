"""The chat completion request as the gateway sees it: checked, cleaned, ready to relay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import InvalidRequest

# Fields that let a client steer the server rather than the generation (vLLM's advisories on
# chat-template injection and media fetching). Everything else passes through untouched,
# notably what PaddleOCR's client sends: mm_processor_kwargs, skip_special_tokens, ...
STRIPPED = ("chat_template", "chat_template_kwargs", "media_io_kwargs")


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat completion body: its bytes and, until `take_body`, its parsed form."""

    payload: dict[str, Any]
    raw: bytes
    model: str
    stream: bool

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
        """The body to send upstream: the served model name, steering fields removed, and
        `mm_processor_kwargs` pixel limits clamped to `max_pixels`."""
        pixels = _clamped_pixels(self.payload.get("mm_processor_kwargs"), max_pixels)
        needs_rewrite = (
            served_model != self.model
            or any(k in self.payload for k in STRIPPED)
            or pixels is not None
        )
        if not needs_rewrite:
            return self.raw  # the common case costs no re-encoding
        cleaned = {k: v for k, v in self.payload.items() if k not in STRIPPED}
        cleaned["model"] = served_model
        if pixels is not None:
            cleaned["mm_processor_kwargs"] = pixels
        return orjson.dumps(cleaned)


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
    """Check that `raw` is a chat completion request; 400 naming the field otherwise."""
    try:
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
    return ChatRequest(payload=payload, raw=raw, model=model, stream=stream)


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
