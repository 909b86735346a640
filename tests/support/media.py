"""A loopback image host for the remote-image tests: an image, redirects, and bad answers."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send

from tests.support.documents import transparent_png
from tests.support.servers import empty_lifespan

PNG = transparent_png(8, 8)


class ImageHost:
    """A loopback HTTP server with an image, redirects, and bad answers; records requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.url = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        path, query = scope["path"], scope["query_string"].decode()
        self.requests.append({"path": path, "headers": headers})
        status, extra, body = 200, [(b"content-type", b"image/png")], PNG
        if path == "/redirect":
            status, extra, body = 302, [(b"location", query.removeprefix("to=").encode())], b""
        elif path.startswith("/hop/"):
            hop = int(path.rsplit("/", 1)[1])
            status, extra, body = 302, [(b"location", f"/hop/{hop + 1}".encode())], b""
        elif path == "/big":
            body = PNG + b"\x00" * 2_000_000
        elif path == "/html":
            extra, body = [(b"content-type", b"image/png")], b"<html>not an image</html>"
        elif path == "/slow":
            await asyncio.sleep(3)
        elif path == "/missing":
            status, body = 404, b"no"
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": body})
