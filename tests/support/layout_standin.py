"""LayoutStandin: a stand-in layout service answering the boxes a test gives it.

Only for what the real service (engine/layout, a random-weight tiny checkpoint) cannot give on
demand: chosen boxes, and faults. It speaks the documented API (issue 36 item 2, docs/layout.md)
and checks every request against it, answering 400 (and recording the complaint) for one that
strays:

    GET  /health    200 always                       GET /ready   200, or 503 while `ready` is off
    POST /v1/layout {"images": ["data:image/…;base64,…", …], "threshold"?, "layout_nms"?,
                    "layout_unclip_ratio"?, "layout_merge_bboxes_mode"?, "layout_shape_mode"?}
         200        {"results": [{"width", "height", "boxes": [...]}, …]} one per image, in order

`boxes(width, height, request_number)` decides each image's boxes (default: none). `mode` picks
a fault: "ok", "hold" (no answer until `release` is set: a slow service, event-driven),
"status" (answers `status` with an error body), "malformed" (200 with a body the API does not
allow), "wrong_size" (measures the page 1 px wider than it is).

Document preprocessing, as the contract says: with `orientation` each page is "classified" as
`angle` and turned counter-clockwise by it (the real service's turn); with `unwarp` it is
"flattened" by the identity; each result then carries `angle` and, when the page changed, the
corrected page as a PNG data URL, and its boxes are asked for that page's size.
"""

from __future__ import annotations

import base64
import binascii
import io
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from PIL import Image
from starlette.types import Receive, Scope, Send

from tests.support.servers import empty_lifespan

OVERRIDES = {
    "threshold": (float, int, dict),
    "layout_nms": (bool,),
    "layout_unclip_ratio": (float, int, list, dict),
    "layout_merge_bboxes_mode": (str, dict),
    "layout_shape_mode": (str,),
    "orientation": (bool,),
    "unwarp": (bool,),
}
SHAPE_MODES = {"auto", "rect", "quad", "poly"}
SHIFTS = {90: (1, 0), 180: (1, 1), 270: (0, 1)}  # PaddleX's rotate_image: OpenCV's pixel
Boxes = Callable[[int, int, int], list[dict[str, Any]]]


class Complaint(ValueError):
    """A request that strays from the layout service's API."""


def box(
    label: str,
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    *,
    score: float = 0.9,
    cls_id: int = 0,
    order: int | None = None,
    polygon: list[list[float]] | None = None,
) -> dict[str, Any]:
    """One box as the API answers it."""
    made: dict[str, Any] = {
        "cls_id": cls_id, "label": label, "score": score, "coordinate": [x1, y1, x2, y2],
        "order": order,
    }  # fmt: skip
    if polygon is not None:
        made["polygon_points"] = polygon
    return made


@dataclass
class Seen:
    """One /v1/layout request as the stand-in saw it."""

    sizes: list[tuple[int, int]]
    overrides: dict[str, Any]
    images: list[str] = field(default_factory=list)  # the data URLs, as sent


@dataclass
class LayoutStandin:
    """The stand-in's ASGI app, its behaviour and what it saw (read from the test's thread)."""

    boxes: Boxes = field(default=lambda width, height, number: [])
    angle: int = 0  # what `orientation` finds on every page
    error_code: str | None = None  # the `code` of mode "status"'s error body
    mode: str = "ok"
    status: int = 500
    ready: bool = True
    url: str = ""  # set once it listens
    seen: list[Seen] = field(default_factory=list)
    complaints: list[str] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def close(self) -> None:
        """What a subclass holds, released at the server's shutdown (nothing here)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send, self.close)
            return
        path, method = scope["path"], scope["method"]
        if path == "/health":
            await _json(send, 200, {"status": "ok"})
        elif path == "/ready":
            await _json(send, 200 if self.ready else 503, {"ready": self.ready})
        elif path == "/v1/layout" and method == "POST":
            await self._layout(await _body(receive), send)
        else:
            await _json(send, 404, _error(f"no route {method} {path}"))

    async def _layout(self, body: bytes, send: Send) -> None:
        try:
            sizes, overrides = self._check(body)
            images: list[str] = orjson.loads(body)["images"]
        except Complaint as exc:
            self.complaints.append(str(exc))
            await _json(send, 400, _error(str(exc)))
            return
        with self._lock:
            self.seen.append(Seen(sizes, overrides, images))
            number = len(self.seen)
        self.arrived.set()
        if self.mode == "hold":
            await anyio.to_thread.run_sync(self.release.wait)
        if self.mode == "status":
            failure = _error("the stand-in fails on purpose")
            failure["error"] |= {"code": self.error_code, "param": "orientation"}
            await _json(send, self.status, failure)
            return
        if self.mode == "malformed":
            await _json(send, 200, {"results": [{"boxes": "none"}]})
            return
        grow = 1 if self.mode == "wrong_size" else 0
        if overrides.get("orientation") or overrides.get("unwarp"):
            results = [self._corrected(url, overrides, number) for url in images]
        else:
            results = [
                {"width": w + grow, "height": h, "boxes": self.boxes(w, h, number)}
                for w, h in sizes
            ]
        await _json(send, 200, {"results": results})

    def _corrected(self, url: str, overrides: dict[str, Any], number: int) -> dict[str, Any]:
        """A page turned by `angle` (with `orientation`) and flattened by the identity."""
        with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as opened:
            page = opened.convert("RGB")
        result: dict[str, Any] = {}
        if overrides.get("orientation"):
            result["angle"] = self.angle
            if self.angle:
                page = _turned(page, self.angle)
        if overrides.get("unwarp") or result.get("angle"):
            out = io.BytesIO()
            page.save(out, format="PNG")
            result["image"] = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
        boxes = self.boxes(page.width, page.height, number)
        return {"width": page.width, "height": page.height, "boxes": boxes, **result}

    @staticmethod
    def _check(body: bytes) -> tuple[list[tuple[int, int]], dict[str, Any]]:
        """The images' sizes and the overrides; Complaint naming what strays from the API."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise Complaint(f"the body is not JSON: {exc}") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("images"), list):
            raise Complaint('the body must be {"images": [data URL, ...], overrides...}')
        if not payload["images"]:
            raise Complaint("`images` is empty")
        unknown = set(payload) - {"images", *OVERRIDES}
        if unknown:
            raise Complaint(f"fields the API does not have: {sorted(unknown)}")
        overrides = {name: value for name, value in payload.items() if name != "images"}
        for name, value in overrides.items():
            if not isinstance(value, OVERRIDES[name]):
                raise Complaint(f"`{name}` has the wrong type: {value!r}")
        if overrides.get("layout_shape_mode", "auto") not in SHAPE_MODES:
            raise Complaint(f"`layout_shape_mode` is not one of {sorted(SHAPE_MODES)}")
        return [_size(url) for url in payload["images"]], overrides


def _turned(page: Image.Image, angle: int) -> Image.Image:
    """PaddleX's `rotate_image` at a right angle (the real service's `turned`): the page turned
    counter-clockwise, shifted one pixel as OpenCV's rotation about `w/2` shifts it."""
    rotated = page.rotate(angle, expand=True)  # exact at right angles
    down, right = SHIFTS[angle]
    out = Image.new("RGB", rotated.size, "black")
    out.paste(rotated.crop((0, 0, rotated.width - right, rotated.height - down)), (right, down))
    return out


def _size(url: object) -> tuple[int, int]:
    if not isinstance(url, str) or not url.startswith("data:image/"):
        raise Complaint("each image must be a data:image/...;base64 URL")
    head, _, payload = url.partition(",")
    if not head.endswith(";base64"):
        raise Complaint("each image must be base64")
    try:
        with Image.open(io.BytesIO(base64.b64decode(payload, validate=True))) as image:
            return image.width, image.height
    except (binascii.Error, OSError) as exc:
        raise Complaint(f"an image cannot be decoded: {exc}") from None


async def _body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None}}


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})
