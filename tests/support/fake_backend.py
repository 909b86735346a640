"""FakeVLLM: a stand-in vLLM server, only for faults a real engine cannot produce on demand.

It speaks vLLM's OpenAI surface (`/health`, `/v1/models`, `/v1/chat/completions`) and records
what it received and whether it saw the client (the gateway) disconnect. `mode` picks a fault:

    ok            a chat completion at once (stream or not, as asked)
    hang          never answers (until the caller disconnects)
    slow_stream   streams a chunk every 50 ms, forever (until the caller disconnects)
    broken_stream streams two chunks, then drops the connection
    status        answers `status` with `error_body`
    unhealthy     `/health` answers 503

`delay` (seconds) holds every chat answer back that long: a backend busy with a long page, to be
killed mid-request (`python -m tests.support.fake_backend PORT [DELAY [SERVED]]` runs one as a
process of its own).
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from tests.support.servers import empty_lifespan, read_body

SERVED = "fake-paddleocr-vl"
STREAM_CHUNKS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":""}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":"Hello"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    b'{"content":" page"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


def completion(model: str) -> dict[str, Any]:
    """A non-streaming chat completion as vLLM shapes it."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello page"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


@dataclass
class FakeVLLM:
    """The fake's behaviour and what it observed (read from the test's thread)."""

    mode: str = "ok"
    url: str = ""  # set once it listens
    status: int = 500
    error_body: bytes = b'{"error":{"message":"boom","type":"InternalServerError","code":500}}'
    served: str = SERVED
    delay: float = 0.0
    content: str | None = None  # the text of every non-streaming answer; None: completion()'s
    hang_after: int | None = None  # answer this many chat requests, then hang (mode "hang")
    finish_reason: str = "stop"  # of every non-streaming answer ("length": cut at max_tokens)
    max_model_len: int = 4096  # what /v1/models says of the served model
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)
    chat_started: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event | None = None  # when given, every chat answer waits until it is set

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await _json(send, 503 if self.mode == "unhealthy" else 200, {})
        elif path == "/v1/models":
            model = {**_model(self.served), "max_model_len": self.max_model_len}
            await _json(send, 200, {"object": "list", "data": [model]})
        elif path == "/v1/chat/completions":
            await self._chat(scope, receive, send)
        else:
            await _json(send, 404, {"error": {"message": "not found"}})

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        payload = orjson.loads(body)
        self.bodies.append(payload)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        self.chat_started.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        while self.gate is not None and not await asyncio.to_thread(self.gate.wait, 0.1):
            pass  # the test opens it once it has seen what it holds the answer for
        if self.hang_after is not None and len(self.bodies) > self.hang_after:
            self.mode = "hang"
        if self.mode == "status":
            await _raw(send, self.status, self.error_body)
        elif self.mode == "hang":
            await self._wait_for_disconnect(receive)
        elif self.mode in ("slow_stream", "broken_stream") or (
            payload.get("stream") and self.content is None and not _continuous(payload)
        ):
            await self._stream(receive, send)
        else:
            answer = completion(payload["model"])
            answer["choices"][0]["finish_reason"] = self.finish_reason
            if self.content is not None:
                answer["choices"][0]["message"]["content"] = self.content
            await reply(send, payload, answer)

    async def _stream(self, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if self.mode == "ok":
            for chunk in STREAM_CHUNKS:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        for i in range(2 if self.mode == "broken_stream" else 10**6):
            chunk = STREAM_CHUNKS[1].replace(b"Hello", f"tok{i}".encode())
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            try:
                message = await asyncio.wait_for(receive(), timeout=0.05)
            except TimeoutError:
                continue
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return
        raise ConnectionAbortedError("FakeVLLM drops the stream on purpose")

    async def _wait_for_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected.set()


def _continuous(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and bool(options.get("continuous_usage_stats"))


async def reply(send: Send, payload: dict[str, Any], answer: dict[str, Any]) -> None:
    """`answer` (a chat completion) as JSON, or as vLLM streams it when `payload` asks for a
    stream: a word an event, the finish reason on the last, usage as `stream_options` asks
    (the answer's own, spread over the events)."""
    if not payload.get("stream"):
        await _json(send, 200, answer)
        return
    headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for event in sse(payload, answer):
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def sse(payload: dict[str, Any], answer: dict[str, Any]) -> list[bytes]:
    """The events of `answer` streamed (see `reply`), `[DONE]` last."""
    options = payload.get("stream_options") or {}
    choice = answer["choices"][0]
    pieces = re.findall(r"\s*\S+|\s+$", choice["message"]["content"] or "") or [""]
    prompt, spent = answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]
    events: list[dict[str, Any]] = []
    for n, piece in enumerate(pieces, 1):
        finish = choice["finish_reason"] if n == len(pieces) else None
        event: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": piece}, "finish_reason": finish}
        ]}  # fmt: skip
        if options.get("continuous_usage_stats"):
            event["usage"] = _usage(prompt, spent * n // len(pieces))
        events.append(event)
    if options.get("include_usage"):
        usage = _usage(prompt, spent)
        events.append(
            {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        )
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "owned_by": "vllm", "max_model_len": 4096}


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    await _raw(send, status, orjson.dumps(body))


async def _raw(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    import sys

    import uvicorn

    port = int(sys.argv[1])
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    served = sys.argv[3] if len(sys.argv) > 3 else SERVED
    uvicorn.run(
        FakeVLLM(delay=delay, served=served), host="127.0.0.1", port=port, log_level="warning"
    )
