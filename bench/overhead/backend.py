"""The stand-in backend: FakeVLLM under uvicorn, run in its own subprocess."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.overhead import ROUTE
from tests.support.fake_backend import FakeVLLM

TOKENS_ASKED = b'"ignore_eos":true'  # what the sse mode's bodies carry (`load.payloads`)


class _Discard(list[Any]):
    """A list that keeps nothing: the stand-in records every body, a benchmark needs none."""

    def append(self, item: Any) -> None:
        pass


class _Paced:
    """Holds each chat answer back by `delay` seconds: a stand-in service time (default none)."""

    def __init__(self, app: ASGIApp, delay: float) -> None:
        self.app = app
        self.delay = delay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def paced(message: Message) -> None:
            if message["type"] == "http.response.start":
                await asyncio.sleep(self.delay)
            await send(message)

        chat = scope["type"] == "http" and scope["path"] == ROUTE
        await self.app(scope, receive, paced if chat else send)


class _Tokens:
    """Streams a request with `ignore_eos` as vLLM does: exactly `max_completion_tokens` chunks
    of one token each, `interval` seconds apart (so each reaches the gateway as a read of its
    own), the last with finish_reason "length", then `[DONE]`. Everything else goes to `app`."""

    def __init__(self, app: ASGIApp, interval: float) -> None:
        self.app = app
        self.interval = interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != ROUTE:
            await self.app(scope, receive, send)
            return
        pieces = []
        while True:
            message = await receive()
            pieces.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(pieces)
        if TOKENS_ASKED not in body:
            replayed: Message = {"type": "http.request", "body": body, "more_body": False}
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return replayed

            await self.app(scope, replay, send)
            return
        await self._stream(orjson.loads(body), send)

    async def _stream(self, payload: dict[str, Any], send: Send) -> None:
        tokens = int(payload["max_completion_tokens"])
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(tokens):
            chunk = {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": payload["model"],
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": f" tok{i}"},
                        "logprobs": None,
                        "finish_reason": "length" if i == tokens - 1 else None,
                    }
                ],
            }
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(self.interval)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def serve_backend(port: int, served: str, delay: float, chunk_interval: float) -> None:
    """Run the stand-in vLLM on `port` until terminated (the benchmark's backend subprocess)."""
    backend: ASGIApp = FakeVLLM(served=served, bodies=_Discard(), headers=_Discard())
    if delay > 0:
        backend = _Paced(backend, delay)
    backend = _Tokens(backend, chunk_interval)
    uvicorn.run(
        backend,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
