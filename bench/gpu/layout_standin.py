"""A stand-in layout service as a process: the document corpus's fixed boxes for every page.

    python -m bench.gpu.layout_standin [--host 127.0.0.1] [--port 8320]
    POST /bench/forward {"url": "http://127.0.0.1:8300"}   # forward to a real service (null: stop)

A stand-in, not the layout service: tests/support/layout_standin.py's ASGI app (the documented
API, every request checked against it) served by uvicorn, answering `bench.gpu.docpages.boxes`
for each image at the size it was sent, so `/v1/ocr` with layout on reads the corpus's seven
blocks on every page whatever the layout model's weights are (the full-size random checkpoint
finds no box on a page: pass 10's layout window answered 0 boxes for each of 2,813 pages).

While forwarding (`/bench/forward`), each request is first sent as it came to the real service
at that URL and answered only once that one has answered 200 (its status and body otherwise):
the real model's work, batching and GPU time are in the document path, and the blocks read are
still the corpus's. The boxes the real service found are counted (`GET /bench/forwarded`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
import orjson
import uvicorn
from starlette.types import Receive, Scope, Send

from bench.gpu import docpages
from tests.support.layout_standin import LayoutStandin, _body, _json


class Standin(LayoutStandin):
    """The test stand-in, forgetting what it saw (a window would keep every request), and
    forwarding to a real service while told to."""

    forward: str | None = None
    counts: dict[str, int]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] == "http" and path == "/bench/forward":
            self.forward = orjson.loads(await _body(receive)).get("url")
            self.counts = {"requests": 0, "boxes": 0, "failed": 0}
            await _json(send, 200, {"forward": self.forward})
        elif scope["type"] == "http" and path == "/bench/forwarded":
            await _json(send, 200, {"forward": self.forward, **getattr(self, "counts", {})})
        else:
            await super().__call__(scope, receive, send)

    async def _layout(self, body: bytes, send: Any) -> None:
        del self.seen[:]
        if self.forward:
            headers = {"content-type": "application/json"}
            async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
                reply = await client.post(f"{self.forward}/v1/layout", content=body,
                                          headers=headers)  # fmt: skip
            self.counts["requests"] += 1
            if reply.status_code != 200:
                self.counts["failed"] += 1
                await _json(send, reply.status_code, reply.json())
                return
            results = reply.json()["results"]
            self.counts["boxes"] += sum(len(result["boxes"]) for result in results)
        await super()._layout(body, send)


def app() -> LayoutStandin:
    """The stand-in answering the corpus's boxes."""
    return Standin(boxes=lambda width, height, _number: docpages.boxes(width, height))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.layout_standin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8320)
    args = parser.parse_args(argv)
    uvicorn.run(app(), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
