"""The eleventh H200 pass's document path (issue 36): the corpus and its fixed boxes, the
`/v1/ocr` load against a stand-in gateway, the stand-in layout process's app, the per-process
GPU memory and the layout service's memory gauges in a window, and the pass's report."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from PIL import Image

from app.bench.load import Target
from bench.gpu import apis, doc_report, docpages, layout_standin, samplers
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import serving


def test_every_page_has_the_seven_blocks_in_place_and_distinct_pixels() -> None:
    """Pages are A4 at 150 dpi and differ; the boxes scale with the page they are asked for,
    in reading order, with the labels PaddleX's pipeline reads."""
    first, second = docpages.draw(0), docpages.draw(1)
    assert first != second
    assert Image.open(io.BytesIO(first)).size == docpages.SIZE
    boxes = docpages.boxes(620, 877)
    assert [b["label"] for b in boxes] == [
        "doc_title", "text", "paragraph_title", "text", "table", "display_formula", "text",
    ]  # fmt: skip
    assert [b["order"] for b in boxes] == list(range(1, 8))
    assert boxes[4]["coordinate"] == [62.0, pytest.approx(394.6, abs=0.1), 558.0,
                                      pytest.approx(596.4, abs=0.1)]  # fmt: skip


def test_the_gateway_s_pipeline_reads_seven_blocks_with_their_prompts() -> None:
    """Planned by app/documents/crops.py: nothing merged or dropped, the table and the formula
    with their prompts, every block between min_pixels (144 tokens) and the page's 1,280."""
    plan = docpages.plan(3)
    assert [b["prompt"] for b in plan] == ["OCR:", "OCR:", "OCR:", "OCR:", "Table Recognition:",
                                           "Formula Recognition:", "OCR:"]  # fmt: skip
    mix = docpages.mix(4)
    assert len(mix) == 7
    assert all(144 <= tokens < 1280 for tokens in mix)
    others = [[b["tokens"] for i, b in enumerate(docpages.plan(n)) if i != 5] for n in range(4)]
    assert all(sizes == others[0] for sizes in others)  # only the trimmed formula's size varies


def test_the_stand_in_process_answers_the_fixed_boxes_for_the_size_sent() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (310, 438), "white").save(buffer, format="PNG")
    url = "data:image/png;base64," + __import__("base64").b64encode(buffer.getvalue()).decode()
    with serving(layout_standin.app()) as standin:
        reply = httpx.post(f"{standin.url}/v1/layout", json={"images": [url, url]}, timeout=10)
        assert httpx.get(f"{standin.url}/ready", timeout=5).status_code == 200
    assert reply.status_code == 200
    results = reply.json()["results"]
    assert len(results) == 2
    assert results[0]["width"] == 310
    assert results[0]["boxes"] == docpages.boxes(310, 438)


def test_while_forwarding_the_stand_in_answers_once_the_real_service_has() -> None:
    """Forwarding to another service: its boxes are counted, the corpus's answered; its error
    is passed on; `null` stops forwarding."""
    buffer = io.BytesIO()
    Image.new("RGB", (100, 140), "white").save(buffer, format="PNG")
    url = "data:image/png;base64," + __import__("base64").b64encode(buffer.getvalue()).decode()
    real = LayoutStandin(boxes=lambda w, h, n: [box("text", 1, 1, 9, 9), box("table", 2, 2, 8, 8)])
    with serving(real) as service, serving(layout_standin.app()) as standin:
        switch = httpx.post(f"{standin.url}/bench/forward", json={"url": service.url}, timeout=5)
        assert switch.json() == {"forward": service.url}
        reply = httpx.post(f"{standin.url}/v1/layout", json={"images": [url]}, timeout=10)
        assert reply.json()["results"][0]["boxes"] == docpages.boxes(100, 140)
        assert len(real.seen) == 1
        real.mode = "status"
        failed = httpx.post(f"{standin.url}/v1/layout", json={"images": [url]}, timeout=10)
        assert failed.status_code == 500
        counts = httpx.get(f"{standin.url}/bench/forwarded", timeout=5).json()
        assert counts == {"forward": service.url, "requests": 2, "boxes": 2, "failed": 1}
        httpx.post(f"{standin.url}/bench/forward", json={"url": None}, timeout=5)
        assert httpx.post(f"{standin.url}/v1/layout", json={"images": [url]}).status_code == 200
        assert len(real.seen) == 2


def ocr_reply(request: httpx.Request) -> httpx.Response:
    """A gateway's /v1/ocr: seven blocks with a layout, none without; page 'bad' fails."""
    body = orjson.loads(request.content)
    assert body["file"].startswith("data:image/jpeg;base64,")
    on = body["layout"] == "on"
    page: dict[str, Any] = {"index": 1, "text": "x",
                            "usage": {"prompt_tokens": 1978 if on else 1290,
                                      "completion_tokens": body["max_tokens"] * (7 if on else 1)},
                            "blocks": [{"index": i} for i in range(7)] if on else None}  # fmt: skip
    if b"QkFE" in request.content:  # "BAD" in base64
        page["error"] = {"code": "layout_unavailable", "message": "down"}
    return httpx.Response(200, json={"layout": body["layout"], "pages": [page]})


def test_an_ocr_request_counts_its_tokens_blocks_and_a_failed_page() -> None:
    counts = apis.OcrCounts()
    send = apis.ocr(Target("t", "http://gw", "k", "m"), layout="on", max_tokens=4, counts=counts)
    good = apis.Page(b"page", "image/jpeg", "good")
    bad = apis.Page(b"BAD", "image/jpeg", "bad")

    async def both() -> list[Any]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(ocr_reply)) as client:
            return [await send(client, good), await send(client, bad)]

    ok, failed = asyncio.run(both())
    assert (ok.status, ok.tokens) == (200, 28)
    assert failed.status == "page_error"
    assert [n for _, n in counts.blocks] == [7, 7]
    assert counts.layouts == {"on": 2}
    assert counts.errors == {"layout_unavailable": 1}


def test_a_window_keeps_each_gpu_process_s_memory_and_the_service_s_gauges(tmp_path: Path) -> None:
    began = datetime(2026, 12, 3, 6, 0, 0)
    stamp = "%Y/%m/%d %H:%M:%S.%f"
    rows = [f"{(began + timedelta(seconds=t)).strftime(stamp)[:-3]}, {pid}, python3, {mib + t}"
            for t in range(10) for pid, mib in ((11, 5000), (12, 70))]  # fmt: skip
    apps = tmp_path / "w.apps.csv"
    apps.write_text("\n".join([*rows, "garbage"]) + "\n")
    seen = samplers.apps_window(apps, began.timestamp(), 2.0, 6.0)
    assert seen is not None
    assert seen["11"] == {"name": "python3", "samples": 5, "first_mib": 5002.0,
                          "last_mib": 5006.0, "max_mib": 5006.0}  # fmt: skip
    metrics = tmp_path / "w.metrics.jsonl"
    with metrics.open("w") as out:
        for t in range(0, 11, 2):
            text = (f'ocrvl_layout_batch_size_sum {8 * t}\nocrvl_layout_batch_size_count {t}\n'
                    f'ocrvl_layout_gpu_memory_bytes{{kind="reserved"}} {2**30 * (1 + t)}\n'
                    f'ocrvl_layout_gpu_memory_bytes{{kind="max_allocated"}} {2**29}\n')  # fmt: skip
            out.write(json.dumps({"t": t, "texts": {"http://l/metrics": text}}) + "\n")
    window = samplers.layout_window(metrics, 2.0, 6.0)
    assert window is not None
    assert window["mean_batch"] == 8.0
    assert window["torch_memory_mib"] == {"max_allocated": 512.0, "reserved": 7 * 1024.0}


def window(name: str, per_s: float, latency: float, **extra: Any) -> dict[str, Any]:
    return {"loop": "closed", "figures": {
        "seconds": 130.0, "latencies_held": 12.0, "steady": True, "answered": int(per_s * 130),
        "statuses": {"200": int(per_s * 130)}, "pages_per_s_count": per_s,
        "pages_per_s_little": per_s, "pages_per_s_c_over_latency": per_s,
        "latency_s": {"p50": latency, "p99": latency * 1.5}, "output_tokens_per_s": per_s * 448,
        "halves_pages_per_s": [per_s, per_s], "window_s": [10.0, 140.0]}} | extra  # fmt: skip


def test_the_report_states_the_layout_path_against_its_own_floor_and_the_layout_share(
    tmp_path: Path,
) -> None:
    """doc-on 17 pages/s against a 20 pages/s blocks floor: 85 %, met; off 30 against a page
    floor of 40; on ÷ off; the layout window's 2 ms per page against the blocks' 50 ms: 3.8 %;
    the real service's window with 40 random blocks a page is not held to the corpus's floor."""
    for kind, ms in (("blocks", 50.0), ("page", 25.0)):
        folder = tmp_path / "floor-doc" / kind
        folder.mkdir(parents=True)
        line = {"floor_ms_per_page": ms, "floor_pages_per_s": 1000 / ms, "rotary": "unfused",
                "page": {"visual_tokens": 1908, "output_tokens": 28, "prompt_tokens": 1908},
                "encoder": {"ms_per_page": 1}, "prefill_ms_per_page": 1,
                "decode": {"ms_per_page": 1}}  # fmt: skip
        (folder / "floor.json").write_text(json.dumps(line))
    ocr = {"blocks_per_page": {"avg": 7.0}, "layouts": {"on": 10}}
    (tmp_path / "01-doc-on-c256.json").write_text(json.dumps(window("doc-on", 17.0, 15, ocr=ocr)))
    (tmp_path / "02-doc-off-c256.json").write_text(json.dumps(window("doc-off", 30.0, 8)))
    real = {"blocks_per_page": {"avg": 40.0}}
    (tmp_path / "03-doc-real-c256.json").write_text(json.dumps(window("d", 5.0, 50, ocr=real)))
    service = {"forward_ms_per_page": 2.0, "mean_batch": 8.0}
    gpu = {"0": {"busy_mean_pct": 12.0, "memory_max_mib": 4000.0}}
    (tmp_path / "04-layout-shipped-c64.json").write_text(
        json.dumps(window("l", 60.0, 1, layout_service=service, gpu=gpu)))  # fmt: skip
    with (tmp_path / "01-doc-on-c256.metrics.jsonl").open("w") as out:  # the gateway's first
        for t in range(0, 151, 10):
            text = (
                f'ocrvl_backend_in_flight{{backend="a"}} 256.0\nocrvl_queue_depth {t}\n'
                f"ocrvl_queue_wait_seconds_sum {5.0 * t}\nocrvl_queue_wait_seconds_count {t}\n"
            )
            out.write(json.dumps({"t": t, "texts": {"http://gw/metrics": text}}) + "\n")
    assert doc_report.main([str(tmp_path), "--out", str(tmp_path / "o"), "--stem", "p"]) == 0
    made = json.loads((tmp_path / "o" / "p.json").read_text())
    targets = made["targets"]
    path = targets["layout_path_over_floor (stand-in boxes)"]
    assert path["ratio"] == pytest.approx(0.85)
    assert path["met"] is True
    assert targets["layout_on_over_off"]["ratio"] == pytest.approx(17 / 30)
    share = targets["layout_of_page_gpu_time (window 4, layout-shipped)"]
    assert share["share"] == pytest.approx(2 / 52)
    assert share["met"] is True
    assert share["gpu_busy_ms_per_page"] == pytest.approx(2.0)  # 12 % of each second, 60 pages
    assert share["share_by_gpu_busy"] == pytest.approx(2 / 52)
    assert path["ratio_prefill_scaled"] == pytest.approx(17 / (1000 / 3))  # 1 + 1 x 1908/1908 + 1
    admitted = made["rows"][0]["gateway_admission"]
    assert admitted["in_flight_per_backend_mean"] == 256.0
    assert admitted["queue_wait_s_mean"] == pytest.approx(5.0)
    real_target = targets["layout_path_over_floor (real service)"]
    assert (real_target["comparable"], real_target["met"]) == (False, None)
    assert made["rows"][1]["x_own_floor"] == pytest.approx(30 / 40)
    assert "| 1 | doc-on | c256 |" in (tmp_path / "o" / "p.md").read_text()


def test_the_layout_share_by_kernel_time_takes_the_batch_sizes_each_window_formed(
    tmp_path: Path,
) -> None:
    """Kernel ms per pass 1.0 / 1.6 / 2.8 / 5.0 at batches 1, 2, 4, 8 against a 50 ms blocks
    floor: batch 8's 0.625 ms a page is 1.2 %; a window of 2 single passes, 10 of 3-4 pages and
    98 of 5-8 (718 pages) is charged 2 x 1.0 + 10 x 2.8 + 98 x 5.0 = 520 ms; one with 10 passes
    of 9-16 (150 pages) past the largest batch measured: 16 x 0.625 ms each, extrapolated."""
    folder = tmp_path / "floor-doc" / "blocks"
    folder.mkdir(parents=True)
    (folder / "floor.json").write_text(json.dumps({"floor_ms_per_page": 50.0,
                                                   "floor_pages_per_s": 20.0}))  # fmt: skip
    per_pass = {"1": 1.0, "2": 1.6, "4": 2.8, "8": 5.0}
    kernels = {"device": "cuda", "gpu": "NVIDIA H200", "dtype": "bfloat16", "compile": False,
               "warm_up_s": 3.0, "input": [800, 800], "repeat": 20, "timer": "cuda-kernels",
               "batches": {b: {"wall_ms_per_pass": 18.0 * int(b) ** 0.5, "event_ms_per_pass": 9.0,
                               "kernel_ms_per_pass": ms, "kernel_ms_per_page": ms / int(b),
                               "kernels_per_pass": 900} for b, ms in per_pass.items()}}  # fmt: skip
    (tmp_path / "layout-kernels.json").write_text(json.dumps(kernels))
    formed = {"<= 1": 2, "<= 2": 0, "<= 4": 10, "<= 8": 98, "<= 16": 0, "<= 32": 0}
    big = dict.fromkeys(formed, 0) | {"<= 16": 10}
    for order, histogram, pages in ((1, formed, 718), (2, big, 150)):
        service = {"forward_ms_per_page": 2.0, "mean_batch": 7.0, "pages": pages,
                   "batches_by_size": histogram}  # fmt: skip
        (tmp_path / f"0{order}-layout-shipped-c64.json").write_text(
            json.dumps(window("l", 60.0, 1, layout_service=service)))  # fmt: skip
    assert doc_report.main([str(tmp_path), "--out", str(tmp_path / "o"), "--stem", "p"]) == 0
    made = json.loads((tmp_path / "o" / "p.json").read_text())
    share = made["targets"]["layout_of_page_gpu_time (kernel time)"]
    assert share["by_batch"]["8"]["share"] == pytest.approx(0.625 / 50.625)
    assert share["by_batch"]["1"]["met"] is True
    first = share["windows"]["window 1, layout-shipped"]
    assert first["kernel_ms_per_page"] == pytest.approx(520 / 718)
    assert first["share"] == pytest.approx((520 / 718) / (520 / 718 + 50))
    assert (first["met"], first["extrapolated"]) == (True, False)
    second = share["windows"]["window 2, layout-shipped"]
    assert second["kernel_ms_per_page"] == pytest.approx(10 * 16 * 0.625 / 150)
    assert second["extrapolated"] is True
    assert made["targets"]["layout_of_page_gpu_time (window 1, layout-shipped)"]["share"] == (
        pytest.approx(2 / 52)
    )  # the forward's wall-time reading, kept
    text = (tmp_path / "o" / "p.md").read_text()
    assert "## The layout model's kernel time" in text
    assert "| 8 | 50.91 | 9.00 | 5.00 | 0.625 | 900 | 1.2% |" in text
