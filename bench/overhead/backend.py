"""The stand-in backend: FakeVLLM under uvicorn, run in its own subprocess."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.overhead import ROUTE
from tests.support.fake_backend import FakeVLLM


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


def serve_backend(port: int, served: str, delay: float) -> None:
    """Run the stand-in vLLM on `port` until terminated (the benchmark's backend subprocess)."""
    backend: ASGIApp = FakeVLLM(served=served, bodies=_Discard(), headers=_Discard())
    if delay > 0:
        backend = _Paced(backend, delay)
    uvicorn.run(
        backend,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
