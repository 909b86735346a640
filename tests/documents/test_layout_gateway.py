"""/v1/ocr with the layout pipeline, in-process: a stand-in layout service gives chosen boxes
(tests/support/layout_standin.py) and a FakeVLLM answers by prompt. What each block sends,
what the page answers, `layout` auto/on/off, the fallbacks, the overrides."""

from __future__ import annotations

import base64
import contextlib
import io
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from PIL import Image, ImageDraw
from starlette.types import Receive, Scope, Send

from app.auth import KeyFile, KeyLimits
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.jobs.test_api import until_ended
from tests.support.fake_backend import FakeVLLM, completion, reply
from tests.support.layout_standin import LayoutStandin, box
from tests.support.prometheus import metric
from tests.support.servers import lifespan_client, read_body, serving

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
WIDTH, HEIGHT = 600, 800
ANSWERS = {
    "OCR:": "Some words",
    "Table Recognition:": "<fcel>a<fcel>b<nl>",
    "Formula Recognition:": "\\[x^2\\]",
    "Chart Recognition:": "Year | Sales\n2024 | 7",
    "Seal Recognition:": "A Seal Co.",
}


class Answering(FakeVLLM):
    """FakeVLLM answering each prompt its own way (ANSWERS), with `finish` as the finish reason
    for the prompts named there; `hold` keeps every answer until `release` is set, counting
    how many wait at once (`most`, and `reached` once `target` wait)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.finish: dict[str, str] = {}
        self.hold = False
        self.release = threading.Event()
        self.reached = threading.Event()
        self.target = 0
        self.running = self.most = self.gone = 0
        self._lock = threading.Lock()

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        payload = orjson.loads(body)
        with self._lock:
            self.bodies.append(payload)
            self.running += 1
            self.most = max(self.most, self.running)
            if self.target and self.running >= self.target:
                self.reached.set()
        self.chat_started.set()
        try:
            if self.mode == "hang":
                await self._wait_for_disconnect(receive)
                with self._lock:
                    self.gone += 1
                return
            if self.hold:
                await anyio.to_thread.run_sync(self.release.wait)
            prompt = payload["messages"][0]["content"][1]["text"]
            answer = completion(payload["model"])
            answer["choices"][0]["message"]["content"] = ANSWERS.get(prompt, "Hello page")
            answer["choices"][0]["finish_reason"] = self.finish.get(prompt, "stop")
            await reply(send, payload, answer)
        finally:
            with self._lock:
                self.running -= 1

    def prompts(self) -> list[str]:
        return [body["messages"][0]["content"][1]["text"] for body in self.bodies]


def page_png(ink: Callable[[ImageDraw.ImageDraw], None] | None = None) -> bytes:
    """A WIDTH x HEIGHT white PNG page, with `ink` drawn on it."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((50, 50), "A title", fill="black")
    if ink is not None:
        ink(draw)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


PAGE_BOXES = [
    box("header", 40, 5, 560, 30),
    box("doc_title", 40, 40, 400, 80, order=1),
    box("text", 40, 100, 560, 160, order=2),
    box("table", 40, 200, 560, 400),
    box("display_formula", 40, 420, 300, 480, order=3),
    box("image", 320, 420, 560, 600),
    box("chart", 40, 620, 300, 760),
    box("footer", 40, 770, 560, 795),
]


def crop_size(body: dict[str, Any]) -> tuple[int, int]:
    url = body["messages"][0]["content"][0]["image_url"]["url"]
    data = base64.b64decode(url.partition(",")[2])
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "JPEG"
        return image.size


@contextlib.contextmanager
def services(
    boxes: list[dict[str, Any]] | None = None, **standin: Any
) -> Iterator[tuple[Answering, LayoutStandin]]:
    """An Answering backend and a stand-in layout service answering `boxes` for every page."""
    chosen = PAGE_BOXES if boxes is None else boxes
    layout = LayoutStandin(boxes=lambda w, h, n: chosen, **standin)
    with serving(Answering()) as fake, serving(layout) as service:
        try:
            yield fake, service
        finally:
            service.release.set()
            fake.release.set()


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, layout: LayoutStandin | str | None, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`, with `layout` as OCRVL_LAYOUT_URL."""
    url = layout.url if isinstance(layout, LayoutStandin) else layout
    extra = {"layout_url": url} if url else {}
    settings = settings_for(fake.url, preprocess_workers=1, **extra, **overrides)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


def upload(data: bytes | None = None, name: str = "page.png") -> dict[str, Any]:
    return {"file": (name, data if data is not None else page_png(), "application/octet-stream")}


async def test_each_block_goes_with_its_labels_prompt_and_the_page_comes_back_as_markdown() -> None:
    """Every text-like block is read with "OCR:", the table with "Table Recognition:", the
    formula with "Formula Recognition:", shaped as PaddleX's client sends a block; the image
    and the chart stay images; the page answers its markdown (also its `text`), its blocks and
    its figures' images, usage summed over the blocks."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload())
    assert response.status_code == 200, response.text
    assert response.headers["x-ocr-layout"] == "on"
    assert sorted(fake.prompts()) == sorted(
        ["OCR:", "OCR:", "OCR:", "OCR:", "Table Recognition:", "Formula Recognition:"]
    )
    for body in fake.bodies:
        assert body["temperature"] == 0
        assert body["skip_special_tokens"] is True
        assert body["mm_processor_kwargs"] == {"min_pixels": 112_896, "max_pixels": 1_003_520}
        assert 0 < body["max_completion_tokens"] <= 4096
    sizes = sorted(crop_size(body) for body in fake.bodies)
    assert (520, 200) in sizes  # the table's crop at the page's own pixels
    document = response.json()
    assert document["layout"] == "on"
    page = document["pages"][0]
    assert page["text"] == page["markdown"]
    assert [block["label"] for block in page["blocks"]] == [b["label"] for b in PAGE_BOXES]
    assert page["markdown"].startswith("# Some words\n\nSome words\n\n\n<table border=1")
    assert (
        '<img src="imgs/img_in_image_box_320_420_560_600.jpg" alt="Image" width="40%" />'
        in (page["markdown"])
    )
    assert "$$ x^2 $$" in page["markdown"]
    assert page["markdown"].count("Some words") == 2  # header and footer: read, not shown
    assert set(page["images"]) == {
        "imgs/img_in_image_box_320_420_560_600.jpg",
        "imgs/img_in_chart_box_40_620_300_760.jpg",
    }
    assert page["images"]["imgs/img_in_chart_box_40_620_300_760.jpg"].startswith(
        "data:image/jpeg;base64,"
    )
    assert page["usage"] == {"prompt_tokens": 60, "completion_tokens": 12, "total_tokens": 72}
    assert document["usage"] == page["usage"]
    assert layout.seen[0].sizes == [(WIDTH, HEIGHT)]  # the whole page, at its own size


async def test_chart_and_seal_recognition_send_those_blocks_too() -> None:
    """With chart_recognition and seal_recognition on, charts and seals are read; the chart's
    table is in the markdown, the seal's text under its image."""
    boxes = [box("chart", 40, 40, 300, 200), box("seal", 320, 40, 500, 200)]
    with services(boxes) as (fake, layout):
        async with gateway(fake, layout) as client:
            fields = {"chart_recognition": "true", "seal_recognition": "true"}
            response = await client.post("/v1/ocr", files=upload(), data=fields)
    assert sorted(fake.prompts()) == ["Chart Recognition:", "Seal Recognition:"]
    markdown = response.json()["pages"][0]["markdown"]
    assert "<th style='text-align: center;'>Year</th>" in markdown
    assert "A Seal Co." in markdown


async def test_layout_off_reads_each_page_whole_even_with_a_service() -> None:
    """`layout=off`: one request per page with the task's prompt, no blocks, no layout call."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"layout": "off"})
    assert response.status_code == 200
    assert fake.prompts() == ["OCR:"]
    assert "blocks" not in response.json()["pages"][0]
    assert response.headers["x-ocr-layout"] == "off"
    assert layout.seen == []


async def test_a_whole_page_task_is_read_whole_under_auto_and_refused_with_on(
    tmp_path: Path,
) -> None:
    """`task=table` (any task but `ocr`) is a prompt for the whole page, which the layout
    pipeline never sends: under `auto` (the default, a service ready) the page is read whole
    with that prompt (the table's HTML back, no layout call), a job alike; `layout=on`, or
    `orientation` (which means on), is a 400 naming `task` rather than the task dropped."""
    with services() as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            auto = await client.post("/v1/ocr", files=upload(), data={"task": "table"})
            job = await client.post("/v1/ocr/jobs", files=upload(), data={"task": "table"})
            assert job.status_code == 202, job.text
            assert (await until_ended(client, job.json()["id"]))["status"] == "succeeded"
            kept = await client.get(f"/v1/ocr/jobs/{job.json()['id']}/result")
            on = await client.post(
                "/v1/ocr", files=upload(), data={"task": "table", "layout": "on"}
            )
            turned = await client.post(
                "/v1/ocr", files=upload(), data={"task": "formula", "orientation": "true"}
            )
            on_job = await client.post(
                "/v1/ocr/jobs", files=upload(), data={"task": "table", "layout": "on"}
            )
    assert auto.status_code == 200, auto.text
    assert auto.headers["x-ocr-layout"] == "off"
    document = auto.json()
    assert (document["layout"], "layout_fallback" in document) == ("off", False)
    assert document["pages"][0]["html"].startswith("<table")
    assert "blocks" not in document["pages"][0]
    assert (kept.json()["layout"], kept.json()["pages"][0]["html"]) == ("off", auto_html(auto))
    assert fake.prompts() == ["Table Recognition:", "Table Recognition:"]
    assert layout.seen == []
    for refused in (on, turned, on_job):
        assert refused.status_code == 400, refused.text
        assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (
            "task",
            "invalid_value",
        )


def auto_html(response: httpx.Response) -> str:
    html: str = response.json()["pages"][0]["html"]
    return html


async def test_without_a_service_auto_reads_pages_whole_and_on_is_a_400() -> None:
    """No OCRVL_LAYOUT_URL: `auto` is `off`; `on` is refused (400 layout_not_configured)."""
    with serving(Answering()) as fake:
        async with gateway(fake, None) as client:
            auto = await client.post("/v1/ocr", files=upload())
            on = await client.post("/v1/ocr", files=upload(), data={"layout": "on"})
    assert auto.status_code == 200
    assert auto.json()["layout"] == "off"
    assert "layout_fallback" not in auto.json()
    assert on.status_code == 400
    assert on.json()["error"]["code"] == "layout_not_configured"
    assert on.json()["error"]["param"] == "layout"
    assert len(fake.bodies) == 1


async def test_no_ready_service_auto_falls_back_to_whole_pages_and_on_is_a_503() -> None:
    """The service answers /ready 503: `auto` reads pages whole and says why (header and
    field); `on` is a 503 layout_unavailable with Retry-After, before any page is read."""
    with services(ready=False) as (fake, layout):
        async with gateway(fake, layout) as client:
            auto = await client.post("/v1/ocr", files=upload())
            on = await client.post("/v1/ocr", files=upload(), data={"layout": "on"})
            stream = await client.post("/v1/ocr", files=upload(), data={"stream": "true"})
    assert auto.status_code == 200
    assert auto.headers["x-ocr-layout"] == "off"
    assert "no layout service is ready" in auto.headers["x-ocr-layout-fallback"]
    assert "/ready answered 503" in auto.json()["layout_fallback"]
    assert on.status_code == 503
    assert on.json()["error"]["code"] == "layout_unavailable"
    assert int(on.headers["retry-after"]) >= 1
    head = orjson.loads(stream.text.splitlines()[0])
    assert (head["layout"], "layout_fallback" in head) == ("off", True)
    assert fake.prompts() == ["OCR:", "OCR:"]  # the two fallbacks; `on` read nothing
    assert layout.seen == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"layout": "maybe"}, "layout"),
        ({"layout_threshold": "1.5"}, "layout_threshold"),
        ({"layout_threshold": '{"x": 0.5}'}, "layout_threshold"),
        ({"layout_nms": "perhaps"}, "layout_nms"),
        ({"layout_unclip_ratio": "[1, 2, 3]"}, "layout_unclip_ratio"),
        ({"layout_unclip_ratio": "0"}, "layout_unclip_ratio"),
        ({"layout_merge_bboxes_mode": "biggest"}, "layout_merge_bboxes_mode"),
        ({"layout_shape_mode": "circle"}, "layout_shape_mode"),
        ({"markdown_ignore_labels": "[1, 2]"}, "markdown_ignore_labels"),
        ({"chart_recognition": "yes"}, "chart_recognition"),
    ],
)
async def test_bad_layout_options_are_400s_naming_the_field(
    fields: dict[str, str], param: str
) -> None:
    """Each malformed layout option is a 400 in OpenAI's shape naming it; nothing is read."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(), data=fields)
            again = await client.post("/v1/ocr", files=upload(), data={"layout": "off"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["type"], error["code"]) == (
        param, "invalid_request_error", "invalid_value",
    )  # fmt: skip
    assert again.status_code == 200  # the server keeps serving
    assert layout.seen == []


async def test_the_layout_overrides_reach_the_service_as_its_api_names_them() -> None:
    """threshold (per class too), NMS, unclip ratio, merge mode and shape mode go to the layout
    service; JSON bodies take the same options as form fields."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            fields = {
                "layout_threshold": '{"22": 0.4, "5": 0.6}', "layout_nms": "true",
                "layout_unclip_ratio": "[1.1, 1.2]", "layout_merge_bboxes_mode": "large",
                "layout_shape_mode": "rect",
            }  # fmt: skip
            form = await client.post("/v1/ocr", files=upload(), data=fields)
            body = {"file": base64.b64encode(page_png()).decode(), "layout_threshold": 0.5}
            json_body = await client.post("/v1/ocr", json=body)
    assert form.status_code == json_body.status_code == 200
    assert layout.seen[0].overrides == {
        "threshold": {"22": 0.4, "5": 0.6}, "layout_nms": True,
        "layout_unclip_ratio": [1.1, 1.2], "layout_merge_bboxes_mode": "large",
        "layout_shape_mode": "rect",
    }  # fmt: skip
    assert layout.seen[1].overrides == {"threshold": 0.5, "layout_shape_mode": "auto"}
    assert layout.complaints == []


async def test_markdown_ignore_labels_and_plain_markdown_are_the_clients_to_choose() -> None:
    """`markdown_ignore_labels=` (empty) keeps the header in the markdown; prettify off gives
    `![]()` images; `markdown_images=false` leaves the images out of the answer."""
    boxes = [box("header", 40, 5, 560, 30), box("image", 40, 40, 300, 300)]
    with services(boxes) as (fake, layout):
        async with gateway(fake, layout) as client:
            fields = {
                "markdown_ignore_labels": "", "prettify_markdown": "false",
                "markdown_images": "false",
            }  # fmt: skip
            response = await client.post("/v1/ocr", files=upload(), data=fields)
    page = response.json()["pages"][0]
    assert page["markdown"] == "Some words\n\n![](imgs/img_in_image_box_40_40_300_300.jpg)"
    assert "images" not in page


async def test_a_block_cut_off_at_its_token_limit_says_length() -> None:
    """A block whose answer hit max_tokens keeps finish_reason "length"; so does its page;
    the client's max_tokens is each block's."""
    with services([box("text", 40, 100, 560, 160), box("table", 40, 200, 560, 400)]) as (
        fake,
        layout,
    ):
        fake.finish["Table Recognition:"] = "length"
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"max_tokens": "9"})
    page = response.json()["pages"][0]
    assert [block["finish_reason"] for block in page["blocks"]] == ["stop", "length"]
    assert page["finish_reason"] == "length"
    assert {body["max_completion_tokens"] for body in fake.bodies} == {9}


def formula_ink(draw: ImageDraw.ImageDraw) -> None:
    draw.rectangle((100, 500, 139, 502), fill="black")  # 40 x 3 px of ink in its box


async def test_a_block_too_small_for_the_model_never_reaches_it_raw() -> None:
    """A formula whose ink is 3 px high (PaddleOCR#17378) and a 1300:6 line (over vLLM's
    200:1) go padded with white to what the model takes; their blocks say so."""
    boxes = [box("display_formula", 90, 490, 300, 520), box("text", 0, 700, 600, 703.5)]
    wide = box("text", 0, 600, 600, 606)
    with services([*boxes, wide]) as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(page_png(formula_ink)))
    blocks = response.json()["pages"][0]["blocks"]
    assert [block["label"] for block in blocks] == ["display_formula", "text"]  # < 6 px: gone
    sizes = {body["messages"][0]["content"][1]["text"]: crop_size(body) for body in fake.bodies}
    assert sizes["Formula Recognition:"] == (40, 4)
    assert "padded with white from 40x3 to 40x4 px" in blocks[0]["guard"]
    assert sizes["OCR:"] == (600, 6)  # 100:1 is fine as it is
    assert "guard" not in blocks[1]


async def test_a_line_over_200_to_1_is_padded() -> None:
    """A 1,300 x 6 px text line (a page wider than the default) is sent 1,300 x 7."""
    boxes = [box("text", 0, 10, 1300, 16)]
    wide = Image.new("RGB", (1400, 100), "white")
    out = io.BytesIO()
    wide.save(out, format="PNG")
    with services(boxes) as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload(out.getvalue()))
    assert crop_size(fake.bodies[0]) == (1300, 7)
    assert "guard" in response.json()["pages"][0]["blocks"][0]


async def test_ndjson_and_markdown_answers_carry_the_same_layout_pages() -> None:
    """With layout on, NDJSON's page line holds the page's markdown and blocks as JSON's page
    does, and the markdown answer is the page's markdown: the three forms, one page."""
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            whole = await client.post("/v1/ocr", files=upload())
            lines = await client.post(
                "/v1/ocr", files=upload(), headers={"accept": "application/x-ndjson"}
            )
            text = await client.post("/v1/ocr", files=upload(), headers={"accept": "text/markdown"})
    page = whole.json()["pages"][0]
    assert page["blocks"]
    assert page["markdown"]
    assert lines.status_code == 200, lines.text
    assert lines.headers["x-ocr-layout"] == "on"
    head, streamed, summary = [orjson.loads(line) for line in lines.text.splitlines()]
    assert (head["object"], head["layout"]) == ("ocr.document", "on")
    assert streamed["object"] == "ocr.page"
    assert streamed["markdown"] == page["markdown"]
    assert [b["label"] for b in streamed["blocks"]] == [b["label"] for b in page["blocks"]]
    assert [b["text"] for b in streamed["blocks"]] == [b["text"] for b in page["blocks"]]
    assert summary["usage"] == page["usage"]
    assert text.status_code == 200, text.text
    assert text.headers["content-type"].startswith("text/markdown")
    assert text.headers["x-ocr-layout"] == "on"
    assert text.text == page["markdown"] + "\n"


async def test_a_page_of_many_blocks_counts_one_page_of_the_key_s_budget(tmp_path: Path) -> None:
    """A key with 1 page a day: a page read as six blocks is one page of its budget (usage says
    1 page, the tokens of all six blocks), and the next page is refused with 429
    `insufficient_quota` before any block reaches the engine."""
    keys = tmp_path / "keys.json"
    key = KeyFile(keys).create("team", KeyLimits(pages_per_day=1))
    with services() as (fake, layout):
        settings = settings_for(
            fake.url,
            preprocess_workers=1,
            layout_url=layout.url,
            api_keys_file=keys,
            data_dir=tmp_path / "data",
        )
        headers = {"authorization": f"Bearer {key}"}
        async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
            first = await client.post("/v1/ocr", files=upload())
            assert first.status_code == 200, first.text
            assert len(fake.bodies) == 6
            for _ in range(100):  # the meter flushes its counts once a second
                usage = (await client.get("/v1/usage")).json()
                if usage["budgets"][0]["used"] == 1:
                    break
                await anyio.sleep(0.1)
            assert usage["budgets"][0]["used"] == 1
            second = await client.post("/v1/ocr", files=upload())
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "insufficient_quota"
    assert len(fake.bodies) == 6


async def test_a_page_with_no_blocks_says_so(tmp_path: Path) -> None:
    """The layout finds no block on a page: the page is a 200 with empty text and
    `empty: "no_blocks"` (JSON, NDJSON and a job's result), the model is never asked; a page
    with blocks carries no `empty`."""
    with services(boxes=[]) as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            whole = await client.post("/v1/ocr", files=upload())
            lines = await client.post(
                "/v1/ocr", files=upload(), headers={"accept": "application/x-ndjson"}
            )
            job = (await client.post("/v1/ocr/jobs", files=upload())).json()
            assert (await until_ended(client, job["id"]))["status"] == "succeeded"
            kept = await client.get(f"/v1/ocr/jobs/{job['id']}/result")
    assert whole.status_code == 200, whole.text
    page = whole.json()["pages"][0]
    assert (page["text"], page["blocks"], page["empty"]) == ("", [], "no_blocks")
    assert orjson.loads(lines.text.splitlines()[1])["empty"] == "no_blocks"
    assert kept.json()["pages"][0]["empty"] == "no_blocks"
    assert fake.bodies == []
    with services() as (fake, layout):
        async with gateway(fake, layout) as client:
            read = (await client.post("/v1/ocr", files=upload())).json()["pages"][0]
    assert read["blocks"]
    assert "empty" not in read


async def test_a_missed_pages_image_is_the_very_jpeg_its_layout_was_found_on(
    tmp_path: Path,
) -> None:
    """`page_images` with the results cache on: a page that misses is laid out on the very
    JPEG that is its `image` (the one its hash made, reused rather than encoded again, must be
    byte for byte what the layout page's own encoding gives)."""
    with services() as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            response = await client.post("/v1/ocr", files=upload(), data={"page_images": "true"})
    assert response.status_code == 200, response.text
    [page] = response.json()["pages"]
    assert "cached" not in page  # a miss: laid out and read
    assert page["image"].startswith("data:image/jpeg;base64,")
    assert layout.seen[0].images == [page["image"]]


async def test_orientation_turns_the_page_before_its_blocks_are_cut() -> None:
    """`orientation=true`: the layout service (a stand-in keeping the contract, finding 90)
    gets a lossless page and sends it back upright; the page's `angle` is 90, its blocks are
    cut from the upright page (its width is the turned page's height), and its `image` (with
    `page_images`) is that page. `layout=off` with it is a 400 naming it."""
    with Image.open(io.BytesIO(page_png())) as upright:
        turned = upright.rotate(-90, expand=True)
        size = upright.size
    out = io.BytesIO()
    turned.save(out, format="PNG")
    with services(angle=90) as (fake, layout):
        async with gateway(fake, layout) as client:
            fields = {"orientation": "true", "page_images": "true"}
            response = await client.post("/v1/ocr", files=upload(out.getvalue()), data=fields)
            off = await client.post("/v1/ocr", files=upload(), data={**fields, "layout": "off"})
    assert response.status_code == 200, response.text
    assert layout.seen[0].overrides["orientation"] is True
    page = response.json()["pages"][0]
    assert page["angle"] == 90
    head, _, payload = page["image"].partition(",")
    assert head == "data:image/png;base64"
    with Image.open(io.BytesIO(base64.b64decode(payload))) as image:
        assert image.size == size
    assert page["blocks"]
    assert off.status_code == 400
    assert off.json()["error"]["param"] == "orientation"


async def test_metrics_time_each_layout_stage_of_a_page() -> None:
    """/metrics counts each stage of the layout pipeline once for a page (render, layout, cut,
    blocks, assemble); the `layout` stage lasts at least as long as the service held the page
    (released here 0.3 s after it arrived: a lower bound, not a race)."""
    with services(mode="hold") as (fake, layout):
        async with gateway(fake, layout) as client:
            async with anyio.create_task_group() as group:
                answers: list[httpx.Response] = []

                async def post() -> None:
                    answers.append(await client.post("/v1/ocr", files=upload()))

                group.start_soon(post)
                await anyio.to_thread.run_sync(layout.arrived.wait)
                await anyio.sleep(0.3)
                layout.release.set()
            exposition = (await client.get("/metrics")).text
    assert answers[0].status_code == 200, answers[0].text
    for stage in ("render", "layout", "cut", "blocks", "assemble"):
        assert metric(exposition, "ocrvl_layout_stage_seconds_count", stage=stage) == 1
    assert metric(exposition, "ocrvl_layout_stage_seconds_sum", stage="layout") >= 0.3
