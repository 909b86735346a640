"""The PaddleX serving API's in-process parts: a backend answering by prompt, a stand-in layout
service with chosen boxes (tests/support/layout_standin.py), pages, and the gateway in front."""

from __future__ import annotations

import base64
import contextlib
import io
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from PIL import Image, ImageDraw
from starlette.types import Receive, Scope, Send

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support import paddlex_pipeline
from tests.support.fake_backend import FakeVLLM, completion, reply
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import lifespan_client, read_body, serving
from tests.support.standin_vlm import StandinVLM

AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
WIDTH, HEIGHT = 600, 800
ANSWERS = {
    "OCR:": "Some words",
    "Table Recognition:": "<fcel>a<fcel>b<nl><fcel>1<fcel>2<nl>",
    "Formula Recognition:": "\\[x^2\\]",
    "Chart Recognition:": "Year | Sales\n2024 | 7",
    "Seal Recognition:": "A Seal Co.",
}
PAGE_BOXES = [
    box("header", 40, 5, 560, 30, cls_id=12),
    box("doc_title", 40, 40, 400, 80, cls_id=6, order=1),
    box("paragraph_title", 40, 84, 400, 98, cls_id=17, order=2),
    box("text", 40, 100, 560, 160, cls_id=22, order=3),
    box("table", 40, 200, 560, 400, cls_id=21),
    box("display_formula", 40, 420, 300, 480, cls_id=5, order=4),
    box("image", 320, 420, 560, 600, cls_id=14),
    box("chart", 40, 620, 300, 760, cls_id=3),
    box("footer", 40, 770, 560, 795, cls_id=8),
]


class Answering(FakeVLLM):
    """FakeVLLM answering each prompt its own way (`answers`, ANSWERS by default)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.answers = dict(ANSWERS)
        self.failing: set[str] = set()  # prompts answered with a 500
        self._lock = threading.Lock()

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        payload = orjson.loads(body)
        with self._lock:
            self.bodies.append(payload)
        prompt = payload["messages"][0]["content"][1]["text"]
        headers = [(b"content-type", b"application/json")]
        if prompt in self.failing:
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": self.error_body})
            return
        answer = completion(payload["model"])
        answer["choices"][0]["message"]["content"] = self.answers.get(prompt, "Hello page")
        await reply(send, payload, answer)  # streamed when asked (the loop guard asks)

    def prompts(self) -> list[str]:
        """Each request's prompt, in arrival order."""
        return [body["messages"][0]["content"][1]["text"] for body in self.bodies]


def page_png(width: int = WIDTH, height: int = HEIGHT, text: str = "A title") -> bytes:
    """A white PNG page with a line of text."""
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).text((50, 50), text, fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def b64(data: bytes) -> str:
    """`data` as PaddleX's `file` carries it."""
    return base64.b64encode(data).decode("ascii")


@contextlib.contextmanager
def services(
    boxes: list[dict[str, Any]] | None = None, **standin: Any
) -> Iterator[tuple[Answering, LayoutStandin]]:
    """An Answering backend and a stand-in layout service answering `boxes` for every page."""
    chosen = PAGE_BOXES if boxes is None else boxes
    layout = LayoutStandin(boxes=lambda w, h, n: [dict(b) for b in chosen], **standin)
    with serving(Answering()) as fake, serving(layout) as service:
        try:
            yield fake, service
        finally:
            service.release.set()


@contextlib.asynccontextmanager
async def gateway(
    backend: FakeVLLM | StandinVLM, layout: LayoutStandin | None, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `backend`, with `layout` as OCRVL_LAYOUT_URL."""
    extra = {"layout_url": [layout.url]} if layout is not None else {}
    settings = settings_for(backend.url, preprocess_workers=1, **extra, **overrides)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


# ------------------------------------------------------------------ PaddleX's own serving code

SCRIPT = Path(__file__).with_name("paddlex_serving.py")
PADDLEX_TIMEOUT = 600.0  # the worker's import ~15 s on a busy machine; `infer` reads pages too


def run_paddlex(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """tests/paddlex/paddlex_serving.py on `spec` in `.venv-paddleocr` (the session's PaddleX
    worker, tests/support/paddlex_pipeline.py's `worker()`); its report."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = workdir / "spec.json", workdir / "out.json"
    spec_path.write_bytes(orjson.dumps(spec))
    done = paddlex_pipeline.call(SCRIPT, spec_path, out_path, PADDLEX_TIMEOUT)
    if not out_path.exists():
        wrote = f"the script wrote nothing ({done.why}):\n{done.output}"
        raise paddlex_pipeline.PaddleXFailed(wrote)
    report: dict[str, Any] = orjson.loads(out_path.read_bytes())
    if not report["ok"]:
        raise paddlex_pipeline.PaddleXFailed(report["error"]["traceback"])
    return report
