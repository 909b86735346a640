"""A stand-in layout service as a process: the corpus's boxes, each page forwarded to the real one.

    python -m bench.gpu.layout_standin [--port 8320] [--forward http://127.0.0.1:8300]

A stand-in, not the layout service: tests/support/layout_standin.py's ASGI app (the documented
API, every request checked against it) served by uvicorn, answering `bench.gpu.corpus.boxes` for
each image at the size it was sent, so `/v1/ocr` with layout on reads each page's blocks
whatever the layout model's weights are (a random-weight checkpoint finds no box on a page).
With `--forward`, each request is first sent as it came to the real service at that URL (one
pool of connections) and answered only once that one has answered 200 (its status and body
otherwise): the real model's work, batching and GPU time are in the path (issue 50).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import httpx
import uvicorn

from bench.gpu import corpus
from tests.support.layout_standin import LayoutStandin, _json


class Standin(LayoutStandin):
    """The test stand-in, forgetting what it saw (a window would keep all), forwarding first."""

    forward: str | None = None
    client: httpx.AsyncClient  # app()'s one pool, closed at the server's shutdown

    async def close(self) -> None:
        await self.client.aclose()

    async def _layout(self, body: bytes, send: Any) -> None:
        del self.seen[:]
        if self.forward:
            headers = {"content-type": "application/json"}
            reply = await self.client.post(f"{self.forward}/v1/layout", content=body,
                                           headers=headers)  # fmt: skip
            if reply.status_code != 200:
                await _json(send, reply.status_code, reply.json())
                return
        await super()._layout(body, send)


def app(forward: str | None = None) -> LayoutStandin:
    """The stand-in answering the corpus's boxes."""
    standin = Standin(boxes=lambda width, height, _number: corpus.boxes(width, height))
    standin.forward = forward  # unbounded; idle connections closed before uvicorn's 5 s do
    standin.client = httpx.AsyncClient(timeout=120.0, trust_env=False, limits=httpx.Limits(
        max_connections=None, keepalive_expiry=4.0))  # fmt: skip
    return standin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.layout_standin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8320)
    parser.add_argument("--forward", help="the real layout service's base URL")
    args = parser.parse_args(argv)
    # keep-alive past the gateway's 4 s (OCRVL_KEEPALIVE_EXPIRY): the gateway closes first
    uvicorn.run(app(args.forward), host=args.host, port=args.port, log_level="warning",
                access_log=False, timeout_keep_alive=75)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
