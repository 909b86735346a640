"""A document's answers asked for as streams, through the loop guard (app/documents/loops.py).

Every block and whole page the pipeline asks for is streamed (`stream_options`: usage on every
chunk, so the tokens spent are known at any cut) and its text watched as it arrives; once its
tail is a loop the stream is closed, so vLLM aborts the request, and the answer is cut: the text
before the loop and one occurrence of its unit, `finish_reason` "repetition" (the model neither
ended it nor ran out of tokens: the gateway stopped it), the usage of what was generated. With
`loops=retry` a stopped answer is asked once more, with a repetition penalty and a token limit
from its useful length; the retry's answer is kept when it does not loop, else the cut.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive

from app.chat import ChatRequest
from app.context import RequestContext
from app.documents import loops
from app.errors import BackendUnavailable, UpstreamError
from app.proxy import Relay

log = logging.getLogger("ocrvl.documents")
MODES = ("cut", "retry", "off")
STOPPED = loops.STOPPED
ABORTED = "abort"  # vLLM's finish_reason of a request it aborted
USAGE = {"include_usage": True, "continuous_usage_stats": True}
RETRY_PENALTY = 1.1  # vLLM's repetition_penalty on a retry (1.0: none)
RETRY_ROOM = 256  # tokens a retry may add beyond twice the first answer's useful tokens


@dataclass(slots=True)
class Answer:
    """A streamed chat completion, read event by event."""

    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    _pending: bytes = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """Read the whole events of `chunk` (an event cut by the network waits for the rest);
        returns them, parsed (`[DONE]` left out)."""
        data = self._pending + chunk
        *events, self._pending = data.split(b"\n\n")
        read = []
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and (payload := line[5:].strip()) != b"[DONE]":
                    read.append(self._read(payload))
        return read

    def _read(self, payload: bytes) -> dict[str, Any]:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"the backend's stream is not SSE JSON: {payload[:200]!r}"
            ) from None
        if not isinstance(event, dict):
            raise UpstreamError(f"the backend's stream is not a chat completion: {payload[:200]!r}")
        if isinstance(event.get("error"), dict):
            message = event["error"].get("message") or "no message"
            raise UpstreamError(f"the backend's stream failed: {message}")
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            self.text += delta.get("content") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return event


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer as the pipeline keeps it; `loop` says how the guard stopped it."""

    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    loop: dict[str, Any] | None = None  # {"unit", "tokens"[, "retry"]}: the answer was stopped
    seen: int = 0  # stopped: the characters the model wrote before the stop


async def answer(
    relay: Relay,
    chat: ChatRequest,
    context: RequestContext,
    receive: Receive,
    guard: tuple[str, str],
) -> Reply:
    """`chat`'s answer (a block's or a whole page's) through the loop guard; `guard`: (the
    block's label or the page's task, the mode: cut, retry or off). An answer the engine
    aborted (finish_reason `abort`: vLLM stopping without a drain, an aborted request) is an
    error, never a page's text: its text is a part, and a kept part would be served again."""
    label, mode = guard
    if mode == "off":
        response = await relay.complete(chat, context.served_model or chat.model, context, receive)
        return whole(Reply(*read_block(bytes(response.body))))
    limit = max_tokens(chat.payload)
    interval = relay.stream_interval  # the gateway reads this stream itself: events by N tokens
    first = await _watched(
        relay, streamed(chat.payload, {}, chat, interval), context, receive, label
    )
    if first.loop is None or mode != "retry":
        return whole(first)
    room = 2 * _useful_tokens(first) + RETRY_ROOM  # its useful length twice, and some
    retry = {
        "repetition_penalty": max(RETRY_PENALTY, float(chat.payload.get("repetition_penalty", 1))),
        "max_completion_tokens": min(limit, room) if limit else room,
    }
    again = await _watched(
        relay, streamed(chat.payload, retry, chat, interval), context, receive, label
    )
    usage = _summed(first.usage, again.usage)
    if again.loop is None:
        return whole(
            Reply(again.text, again.finish_reason, usage, {**first.loop, "retry": "answer"})
        )
    return Reply(first.text, first.finish_reason, usage, {**first.loop, "retry": "cut"})


async def _watched(
    relay: Relay, chat: ChatRequest, context: RequestContext, receive: Receive, label: str
) -> Reply:
    """One streamed answer, stopped and cut if it loops."""
    answer, watch = Answer(), loops.Watch(loops.limits(label))
    limit = max_tokens(chat.payload)  # read now: the relay takes the body

    async def reader(chunk: bytes) -> bool:
        answer.feed(chunk)
        return not watch.sees_loop(answer.text)

    await relay.watch(chat, context.served_model or chat.model, context, receive, reader)
    return ended(answer, watch, (label, limit), context)


def whole(reply: Reply) -> Reply:
    """`reply`, unless the engine aborted it (BackendUnavailable: its text is only a part)."""
    if reply.finish_reason == ABORTED:
        raise BackendUnavailable(
            "the engine aborted this answer before it ended (it was stopping, or the request was "
            "aborted there); nothing of it is kept: ask for the page again"
        )
    return reply


def ended(
    answer: Answer, watch: loops.Watch, guard: tuple[str, int | None], context: RequestContext
) -> Reply:
    """A watched answer as it ended: whole, or stopped at a loop (cut, counted on `context`
    and logged); `guard`: (its label, its max_tokens)."""
    if watch.loop is None:
        context.truncated = context.truncated or answer.finish_reason == "length"
        return Reply(answer.text, answer.finish_reason, answer.usage)
    label, limit = guard
    spent = int((answer.usage or {}).get("completion_tokens") or 0)
    avoided = max((limit or spent) - spent, 0)
    context.stops.append((label, avoided))
    log.info(
        "loop stopped",
        extra={
            "request_id": context.request_id, "label": label, "unit_chars": watch.loop.size,
            "tokens": spent, "tokens_avoided": avoided, "chars": len(answer.text),
        },
    )  # fmt: skip
    loop = {"unit": watch.loop.size, "tokens": spent}
    return Reply(watch.loop.cut(answer.text), STOPPED, answer.usage, loop, len(answer.text))


def streamed(
    payload: dict[str, Any], changes: dict[str, Any], chat: ChatRequest, interval: int = 1
) -> ChatRequest:
    """`payload` as a stream asking for usage on every chunk, with `changes` (a chat request's
    inline images stay where they are in its raw body: `ChatRequest.encode`); `interval` > 1:
    vLLM's `stream_interval`, an event every that many tokens (the first and last at once)."""
    body = {**payload, **changes, "stream": True, "stream_options": USAGE}
    if interval > 1:
        body["stream_interval"] = interval
    if "max_completion_tokens" in changes:
        body.pop("max_tokens", None)
    return ChatRequest(
        body, chat.raw, chat.model, stream=True, blobs=chat.blobs, pages=chat.pages,
        units=chat.units, edited=True,
    )  # fmt: skip


def max_tokens(payload: dict[str, Any]) -> int | None:
    limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
    return limit if isinstance(limit, int) else None


def _useful_tokens(reply: Reply) -> int:
    """The tokens of a stopped answer before its loop (by the share of text kept), at least 1."""
    spent = int((reply.usage or {}).get("completion_tokens") or 0)
    share = len(reply.text) / reply.seen if reply.seen else 1.0
    return max(int(spent * share), 1)


def _summed(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two answers' usage added up (a retry spends both)."""
    if first is None or second is None:
        return first or second
    names = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {name: int(first.get(name) or 0) + int(second.get(name) or 0) for name in names}


def read_block(body: bytes) -> tuple[str, str | None, dict[str, Any] | None]:
    """(text, finish_reason, usage) of the backend's chat completion; UpstreamError if none."""
    try:
        answer = orjson.loads(body)
        choice = answer["choices"][0]
        text = choice["message"].get("content") or ""
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        raise UpstreamError(
            f"the backend's answer is not a chat completion: {body[:200]!r}"
        ) from None
    return text, choice.get("finish_reason"), answer.get("usage")


def completion(reply: Reply, model: str, request_id: str) -> dict[str, Any]:
    """A guarded chat request's answer as OpenAI's chat completion (and `loop` when stopped)."""
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": reply.usage,
    }
    if reply.loop is not None:
        body["loop"] = reply.loop
    return body
