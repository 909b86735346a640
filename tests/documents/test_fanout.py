"""Page fan-out on injected faults: a failing page, a vanished client, the concurrency bound.

The real engine cannot fail one page of three on demand, nor hang; FakeVLLM stands in here only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from PIL import Image
from starlette.types import Receive, Scope, Send

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM, completion
from tests.support.servers import ThreadedServer, lifespan_client, serving

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


class PageFaults(FakeVLLM):
    """FakeVLLM that fails the chat requests numbered in `failing` (1-based, arrival order) and
    counts how many it serves at once."""

    def __init__(self, failing: set[int], delay: float = 0.0, **options: Any) -> None:
        super().__init__(delay=delay, **options)
        self.failing = failing
        self.arrived = 0
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._lock:
            self.arrived += 1
            number = self.arrived
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        saved = self.mode
        try:
            if number in self.failing:
                self.mode = "status"
            await super()._chat(scope, receive, send)
        finally:
            self.mode = saved
            with self._lock:
                self.running -= 1


def gateway(fake: FakeVLLM, **overrides: Any) -> Any:
    """The gateway in-process in front of `fake`, one preprocessing worker."""
    settings = settings_for(fake.url, preprocess_workers=1, **overrides)
    return lifespan_client(create_app(settings), headers=AUTH, timeout=60)


@pytest.fixture
def faults() -> Iterator[PageFaults]:
    """A PageFaults backend whose second page fails with 500."""
    with serving(PageFaults({2})) as backend:
        yield backend


def upload(count: int) -> dict[str, Any]:
    """A `count`-page PDF as the multipart `file`."""
    return {"file": ("doc.pdf", pdf(count, 200, 280), "application/pdf")}


async def test_a_failed_page_is_reported_on_it_and_the_others_come_back(faults: PageFaults) -> None:
    """Page 2 of 3 fails upstream: 200, pages 1 and 3 have text, page 2 has the error in
    OpenAI's shape; the headers count the failure."""
    async with gateway(faults, ocr_page_concurrency=1) as client:
        response = await client.post("/v1/ocr", files=upload(3))
    assert response.status_code == 200
    assert response.headers["x-ocr-pages-failed"] == "1"
    pages = response.json()["pages"]
    assert [p["index"] for p in pages] == [1, 2, 3]
    assert [p["text"] for p in pages] == ["Hello page", None, "Hello page"]
    assert pages[1]["error"] == {  # vLLM's 500 in the gateway's words (app/proxy.py)
        "message": "boom", "type": "server_error", "param": None, "code": "backend_error",
    }  # fmt: skip
    assert "error" not in pages[0]
    assert response.json()["usage"]["total_tokens"] == 24


async def test_a_failed_page_in_the_stream_and_in_markdown(faults: PageFaults) -> None:
    """NDJSON carries the failed page's line and a summary that counts it; markdown marks it."""
    async with gateway(faults, ocr_page_concurrency=1) as client:
        stream = await client.post("/v1/ocr", files=upload(3), data={"stream": "true"})
        faults.arrived = 0
        markdown = await client.post(
            "/v1/ocr", files=upload(3), headers={"accept": "text/markdown"}
        )
    lines = [orjson.loads(line) for line in stream.text.splitlines()]
    assert lines[-1]["object"] == "ocr.summary"
    assert lines[-1]["failed"] == 1
    assert [line["index"] for line in lines[1:-1] if "error" in line] == [2]
    assert markdown.text == "Hello page\n\n<!-- page 2 failed: boom -->\n\nHello page\n"


async def test_when_every_page_fails_the_answer_is_that_error() -> None:
    """A one-page document whose page fails answers with the page's status and error body."""
    with serving(PageFaults({1}, status=503)) as backend:
        async with gateway(backend) as client:
            response = await client.post("/v1/ocr", files=upload(1))
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "boom"


async def test_pages_in_flight_are_bounded_per_request() -> None:
    """Six pages with OCRVL_OCR_PAGE_CONCURRENCY=2: never more than two at the backend."""
    with serving(PageFaults(set(), delay=0.3)) as backend:
        async with gateway(backend, ocr_page_concurrency=2) as client:
            response = await client.post("/v1/ocr", files=upload(6))
    assert response.status_code == 200
    assert backend.arrived == 6
    assert backend.most_running == 2


async def test_the_per_key_limit_applies_to_ocr(faults: PageFaults) -> None:
    """With one request per minute per key, a second document is refused with 429."""
    faults.failing = set()
    async with gateway(faults, key_rpm=1) as client:
        first = await client.post("/v1/ocr", files=upload(1))
        second = await client.post("/v1/ocr", files=upload(1))
    assert first.status_code == 200
    assert second.status_code == 429


async def test_a_client_that_leaves_closes_every_page_upstream() -> None:
    """The client disconnects while pages hang at the backend: every page is closed upstream
    (the backend sees the disconnect) and no page is started afterwards."""
    backend = FakeVLLM(mode="hang")
    with ThreadedServer(backend) as upstream:
        backend.url = upstream.url
        app = create_app(settings_for(backend.url, preprocess_workers=1, ocr_page_concurrency=2))
        with ThreadedServer(app, lifespan="on") as server:
            async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as client:
                leaving = asyncio.create_task(client.post("/v1/ocr", files=upload(5)))
                deadline = time.monotonic() + 30  # generous: five pages rasterised first
                while len(backend.bodies) < 2:
                    assert time.monotonic() < deadline, "two pages never reached the backend"
                    assert not leaving.done(), leaving.result().text
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # a negative check: no third page while two hang
                in_flight = len(backend.bodies)
                leaving.cancel()  # httpx closes the connection: the client leaves
                with contextlib.suppress(asyncio.CancelledError):
                    await leaving
            closed = await asyncio.to_thread(backend.disconnected.wait, 30)
            assert closed, "the hanging page was never closed upstream"
            started = len(backend.bodies)
            await asyncio.sleep(1.0)  # a negative check: no page starts once the client left
    assert in_flight == 2  # the bound: two pages were in flight when the client left
    assert started == 2
    assert len(backend.bodies) == started


async def test_an_unsupported_file_is_refused_before_any_page_is_sent(faults: PageFaults) -> None:
    """A GIF is a 400 on `file`; the backend sees nothing."""
    async with gateway(faults) as client:
        response = await client.post(
            "/v1/ocr", files={"file": ("a.gif", b"GIF89a....", "image/gif")}
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "file"
    assert faults.arrived == 0


@pytest.mark.parametrize(
    ("task", "prompt"),
    [("ocr", "OCR:"), ("table", "Table Recognition:"), ("formula", "Formula Recognition:"),
     ("chart", "Chart Recognition:"), ("spotting", "Spotting:"), ("seal", "Seal Recognition:")],
)  # fmt: skip
async def test_each_task_sends_the_models_prompt_and_the_resized_page(
    faults: PageFaults, task: str, prompt: str
) -> None:
    """The page request carries the task's prompt, a JPEG at the processor's size and the same
    pixel bounds in mm_processor_kwargs (the engine then resizes nothing)."""
    faults.failing = set()
    async with gateway(faults) as client:
        response = await client.post(
            "/v1/ocr", files=upload(1), data={"task": task, "max_tokens": "7"}
        )
    assert response.status_code == 200
    body = faults.bodies[0]
    image, text = body["messages"][0]["content"]
    assert text == {"type": "text", "text": prompt}
    assert image["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert body["mm_processor_kwargs"] == {"min_pixels": 112_896, "max_pixels": 1_003_520}
    assert body["max_tokens"] == 7
    assert body["model"] == faults.served


async def test_a_table_answer_in_otsl_also_comes_back_as_html(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """task=table: the OTSL answer is kept in `text` and converted into `html`."""
    otsl = "<fcel>a<fcel>b<nl><fcel>c<fcel>d<nl>"

    def table(model: str) -> dict[str, Any]:
        answer = completion(model)
        answer["choices"][0]["message"]["content"] = otsl
        return answer

    monkeypatch.setattr("tests.support.fake_backend.completion", table)
    with serving(FakeVLLM()) as backend:
        async with gateway(backend) as client:
            response = await client.post("/v1/ocr", files=upload(1), data={"task": "table"})
    page = response.json()["pages"][0]
    assert page["text"] == otsl
    assert page["html"] == (
        "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"
    )


async def test_a_spotting_answer_comes_back_as_regions_in_page_pixels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """task=spotting: asked with the special tokens kept, the page (400x560 px at 144 dpi)
    enlarged twice before the model's resize, the answer read into `spotting` regions with
    their polygons in page pixels and `text` their texts."""
    answer = (
        "<|TEXT_START|>Total<|TEXT_END|><|LOC_BEGIN|><|LOC_100|><|LOC_500|><|LOC_300|>"
        "<|LOC_500|><|LOC_300|><|LOC_600|><|LOC_100|><|LOC_600|><|LOC_END|>"
    )

    def spotted(model: str) -> dict[str, Any]:
        made = completion(model)
        made["choices"][0]["message"]["content"] = answer
        return made

    monkeypatch.setattr("tests.support.fake_backend.completion", spotted)
    with serving(FakeVLLM()) as backend:
        async with gateway(backend) as client:
            response = await client.post("/v1/ocr", files=upload(1), data={"task": "spotting"})
    sent = backend.bodies[0]
    assert sent["skip_special_tokens"] is False
    url = sent["messages"][0]["content"][0]["image_url"]["url"]
    with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as image:
        assert image.size == (812, 1120)  # 800x1120, then to multiples of 28
    page = response.json()["pages"][0]
    assert page["text"] == "Total"
    assert page["spotting"] == [
        {"text": "Total", "polygon": [[40.0, 280.0], [120.0, 280.0], [120.0, 336.0], [40.0, 336.0]]}
    ]


async def test_ocr_needs_a_key(faults: PageFaults) -> None:
    """No key: 401 in OpenAI's shape, and nothing reaches the backend."""
    async with gateway(faults) as client:
        response = await client.post("/v1/ocr", files=upload(1), headers={"authorization": ""})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert faults.arrived == 0
