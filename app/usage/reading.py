"""The engine's own `usage` read off its answers as they pass through the relay, unparsed.

A whole answer ends with `"usage":{"prompt_tokens":N,...}`: found from the end with a byte
search. A stream carries it in its last event before `[DONE]` (`"choices":[],"usage":{...}`),
but only when the request asked (`stream_options.include_usage`): a request that did not is made
to ask (`ask_for_usage`), and that one event is then taken out of the stream (`StreamUsage`),
so the client gets the bytes it would have got without it.
"""

from __future__ import annotations

import re

from app.chat import ChatRequest, content_parts
from app.context import RequestContext

MARK = b'"usage":{'
PROMPT = re.compile(rb'"prompt_tokens":(\d+)')
COMPLETION = re.compile(rb'"completion_tokens":(\d+)')
ASK = b'"stream_options":{"include_usage":true},'
EVENT_END = b"\n\n"
FINISH = b'"finish_reason":"'  # a finishing chunk (a stream's others say null)
FINGERPRINT = re.compile(rb'"system_fingerprint":"[^"]*"')
HELD_MAX = 1 << 20  # an event longer than this is no usage event: passed on, not held


def pages_of(chat: ChatRequest) -> int:
    """The pages a chat request counts: one when it holds an image, else none; `n` > 1
    sequences of it count n (the request policy's weight, `chat.pages`)."""
    if chat.blobs is not None:  # an inline image, left unparsed
        return chat.pages
    images = any(part.get("type") == "image_url" for _, part in content_parts(chat.payload))
    return chat.pages if images else 0


def read_usage(answer: bytes, start: int = 0) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the last `usage` object in `answer[start:]`, if any."""
    at = answer.rfind(MARK, start)
    if at < 0:
        return None
    end = answer.find(b"}", at)
    if end < 0:
        return None
    prompt = PROMPT.search(answer, at, end)
    completion = COMPLETION.search(answer, at, end)
    return (
        int(prompt[1]) if prompt else 0,
        int(completion[1]) if completion else 0,
    )


def count_answer(context: RequestContext, answer: bytes) -> None:
    """One answer came back whole: count it and its tokens on `context`."""
    context.answered += 1
    found = read_usage(answer)
    if found is not None:
        context.prompt_tokens += found[0]
        context.completion_tokens += found[1]


def ask_for_usage(chat: ChatRequest) -> bool | None:
    """Make a stream whose client did not ask for usage ask vLLM for it.

    Returns None when nothing was changed (not a stream, or the client asked itself), False
    when the payload was edited (it had `stream_options`), True when the body must be
    `spliced` (it had none: the client's bytes stay as they are).
    """
    if not chat.stream:
        return None
    if "stream_options" not in chat.payload:
        return True
    options = chat.payload["stream_options"]
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    kept = options if isinstance(options, dict) else {}
    # continuous stats would put usage on every chunk: off, as the client's request had it
    asked = {"include_usage": True, "continuous_usage_stats": False}
    chat.payload["stream_options"] = {**kept, **asked}
    chat.edited = True
    return False


def spliced(body: bytes) -> tuple[bytes, bytes, memoryview]:
    """`body` (a JSON object without `stream_options`) asking for the usage chunk, in pieces
    (a page's body is large: not copied to join them)."""
    at = body.find(b"{") + 1
    return body[:at], ASK, memoryview(body)[at:]


class StreamUsage:
    """Reads the usage event of a stream; with `strip`, also takes it out of the stream.

    Events end with a blank line. A chunk that ends mid-event keeps its tail: read again with the
    next chunk, and with `strip` held back until then (an event is cut only where the network cut
    it, so this is rare and costs no more than the next chunk's wait). With `strip`, a finishing
    event is held too, until the next event: asked for usage, vLLM moves `system_fingerprint`
    from the finishing chunk to the usage chunk, and it is put back where it would have been.
    """

    def __init__(self, context: RequestContext, *, strip: bool) -> None:
        self._context = context
        self._strip = strip
        self._tail = b""
        self._held = b""  # with `strip`: the finishing event(s), waiting for the usage event

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of `chunk` to send on (all of them unless `strip` takes the usage event)."""
        data = self._tail + chunk if self._tail else chunk
        if data.endswith(EVENT_END) or len(data) > HELD_MAX:
            whole, self._tail = data, b""
        else:
            cut = data.rfind(EVENT_END)
            cut = 0 if cut < 0 else cut + len(EVENT_END)
            whole, self._tail = data[:cut], data[cut:]
        marked = whole.rfind(MARK)
        if marked >= 0:
            found = read_usage(whole, marked)
            if found is not None:  # the last one is the whole answer's (continuous: so far)
                self._context.prompt_tokens, self._context.completion_tokens = found
        if not self._strip:
            return chunk
        if marked < 0 and not self._held and FINISH not in whole:
            return whole  # the common chunk: passed as it came
        return self._stripped(self._held + whole)

    def rest(self) -> bytes:
        """What is still held back at the stream's end (with `strip`; else nothing)."""
        held, self._held, self._tail = self._held + self._tail, b"", b""
        return held if self._strip else b""

    def _stripped(self, events: bytes) -> bytes:
        """`events` to send: without the usage event (its fingerprint put back), or up to a
        finishing event, which is held until the next event comes."""
        self._held = b""
        at = events.rfind(MARK)
        start = _event_start(events, at)
        end = events.find(EVENT_END, at) if at >= 0 else -1
        if end >= 0 and b'"choices":[]' in events[start:end]:
            fingerprint = FINGERPRINT.search(events, start, end)
            before = events[:start]
            if fingerprint is not None:
                before = _fingerprinted(before, fingerprint[0])
            return before + events[end + len(EVENT_END) :]
        finish = events.rfind(FINISH)
        if finish < 0:
            return events
        start = _event_start(events, finish)
        self._held = events[start:]
        return events[:start]


def _event_start(events: bytes, at: int) -> int:
    """Where the event holding position `at` begins (0: the first, or `at` < 0)."""
    if at < 0:
        return 0
    end = events.rfind(EVENT_END, 0, at)
    return 0 if end < 0 else end + len(EVENT_END)


def _fingerprinted(events: bytes, field: bytes) -> bytes:
    """`events` with `field` (`"system_fingerprint":"…"`) put at the end of each finishing
    event that lacks it, as vLLM writes it when not asked for usage."""
    pieces = events.split(EVENT_END)
    for i, event in enumerate(pieces):
        if FINISH in event and b'"system_fingerprint"' not in event and event.endswith(b"}"):
            pieces[i] = event[:-1] + b"," + field + b"}"
    return EVENT_END.join(pieces)
