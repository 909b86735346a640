"""A chat request that asked for the loop guard (`X-OCRVL-Loop-Guard: on`, OCRVL_CHAT_LOOP_GUARD;
a batch's lines: app/batches/requests.py).

Its answer is streamed from the engine and watched as a document's block is
(app/documents/streams.py). Unstreamed, it is answered as one chat completion, cut at a loop.
Streamed, its events go to the client as they arrive (re-written without the usage the gateway
asked for on every chunk, unless the client asked for it); at a loop the engine's stream is
closed and the client gets a last event with `finish_reason` "repetition" and `loop`, the usage
event if it asked for one, and `[DONE]`. What the client has received by then is the text up to
the stop: the repeats the guard needed to see one (its span, 640 characters) included.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.chat import ChatRequest
from app.context import CLIENT_CLOSED, RequestContext
from app.documents import loops, streams
from app.errors import ClientClosed, GatewayError, error_response
from app.proxy import Relay

LABEL = "chat"  # its label in ocrvl_loops_stopped_total; the text thresholds


async def answer(
    relay: Relay, chat: ChatRequest, context: RequestContext, receive: Receive
) -> Response:
    """The guarded answer: a chat completion, or (a streamed request) a GuardedStream."""
    if chat.stream:
        return GuardedStream(relay, chat, context)
    body = await completion(relay, chat, context, receive)
    return Response(orjson.dumps(body), media_type="application/json")


async def completion(
    relay: Relay, chat: ChatRequest, context: RequestContext, receive: Receive
) -> dict[str, Any]:
    """An unstreamed request's guarded answer as OpenAI's chat completion (a batch line's too:
    app/batches/requests.py), `loop` on it when it was stopped."""
    reply = await streams.answer(relay, chat, context, receive, (LABEL, "cut"))
    return streams.completion(reply, context.served_model or chat.model, context.request_id)


class GuardedStream(Response):
    """The engine's stream passed on event by event while the loop guard watches it."""

    def __init__(self, relay: Relay, chat: ChatRequest, context: RequestContext) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(
            {"content-type": "text/event-stream", "cache-control": "no-cache",
             "x-accel-buffering": "no"}
        )  # fmt: skip
        self._relay, self._context = relay, context
        self._model = context.served_model or chat.model  # as the engine names it
        options = chat.payload.get("stream_options")
        options = options if isinstance(options, dict) else {}
        self._usage = options.get("include_usage") is True  # the client's own wish
        self._every = self._usage and options.get("continuous_usage_stats") is True
        self._limit = streams.max_tokens(chat.payload)
        self._chat = streams.streamed(chat.payload, {}, chat)
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer, watch = streams.Answer(), loops.Watch(loops.limits(LABEL))

        async def reader(chunk: bytes) -> bool:
            events = answer.feed(chunk)
            looped = watch.sees_loop(answer.text)
            await self._start(send)
            body = b"".join(self._event(event) for event in events)
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            return not looped

        try:
            await self._relay.watch(self._chat, self._model, self._context, receive, reader)
        except ClientClosed:
            self._context.status = CLIENT_CLOSED
            return
        except GatewayError as error:
            if not self._started:  # nothing sent yet: the error is the answer
                await error_response(error)(scope, receive, send)
                return
            event = b"data: " + orjson.dumps(error.body()) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        else:
            await self._start(send)
            reply = streams.ended(answer, watch, (LABEL, self._limit), self._context)
            await send({"type": "http.response.body", "body": self._end(reply), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _start(self, send: Send) -> None:
        if not self._started:
            self._started = True
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)

    def _event(self, event: dict[str, Any]) -> bytes:
        """An engine's event as the client asked for it: usage only where it asked."""
        if not event.get("choices"):  # the usage event: sent at the end (`_end`)
            return b""
        if not self._every:
            event.pop("usage", None)
        return b"data: " + orjson.dumps(event) + b"\n\n"

    def _end(self, reply: streams.Reply) -> bytes:
        """A stopped answer's last event, and the usage event when the client asked."""
        base = {
            "id": f"chatcmpl-{self._context.request_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._model,
        }
        out = b""
        if reply.loop is not None:
            choice = {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}
            last = {**base, "choices": [choice], "loop": reply.loop}
            out += b"data: " + orjson.dumps(last) + b"\n\n"
        if self._usage and reply.usage is not None:
            out += b"data: " + orjson.dumps({**base, "choices": [], "usage": reply.usage}) + b"\n\n"
        return out
