"""The layout service's HTTP API, served for real (`python -m ocrvl_layout`, the tiny checkpoint):
the answer's shape and order for pages of different sizes, the overrides, every bad input as an
OpenAI-shaped 4xx after which the service keeps serving, and /health, /ready, /metrics."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.layout_pages import layout_page, png
from tests.support.pages import data_url
from tests.support.tiny_layout import LABELS

pytestmark = pytest.mark.engine

# PaddleX's SKIP_ORDER_LABELS: blocks outside the reading flow get no order number
UNNUMBERED = {"figure_title", "vision_footnote", "image", "chart", "table", "header",
              "header_image", "footer", "footer_image", "footnote", "aside_text"}  # fmt: skip
SIZES = ((1240, 1754), (1754, 1240), (1000, 1400), (640, 1600))


def page_url(seed: int, width: int, height: int, fmt: str = "PNG") -> str:
    image = layout_page(seed, width, height)
    if fmt == "PNG":
        return data_url(png(image), "image/png")
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return data_url(out.getvalue(), "image/jpeg")


def post(url: str, body: Any, **options: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/layout", json=body, timeout=120, **options)


def assert_page(result: dict[str, Any], width: int, height: int, *, outlines: bool) -> None:
    """One page's answer: its own size, boxes inside it, labels by id, PaddleX's order numbers."""
    assert (result["width"], result["height"]) == (width, height)
    numbered = []
    for box in result["boxes"]:
        x1, y1, x2, y2 = box["coordinate"]
        assert all(isinstance(v, int) for v in box["coordinate"])
        assert 0 <= x1 < x2 <= width, box
        assert 0 <= y1 < y2 <= height, box
        assert box["label"] == LABELS[box["cls_id"]]
        assert box["score"] > 0.3
        assert ("polygon_points" in box) == outlines
        if box["label"] in UNNUMBERED:
            assert box["order"] is None
        else:
            numbered.append(box["order"])
    assert numbered == list(range(1, len(numbered) + 1)), "reading order numbers 1..n"


def test_one_result_per_image_in_the_order_sent(layout_service: str) -> None:
    """Four pages of four shapes (PNG and JPEG) in one request: four results in that order,
    each in its own pixels, its boxes final and numbered in reading order."""
    images = [page_url(i, w, h, "PNG" if i % 2 else "JPEG") for i, (w, h) in enumerate(SIZES)]
    response = post(layout_service, {"images": images})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == len(SIZES)
    for result, (width, height) in zip(results, SIZES, strict=True):
        assert_page(result, width, height, outlines=True)
    assert sum(len(result["boxes"]) for result in results) >= 10, "the tiny model found boxes"


def test_a_page_gets_the_same_boxes_alone_and_among_others(layout_service: str) -> None:
    """Batching does not change a page's answer: alone, or second of three in one request."""
    target = page_url(7, 1240, 1754)
    alone = post(layout_service, {"images": [target]}).json()["results"][0]
    others = [page_url(8, 900, 900), target, page_url(9, 1754, 1240)]
    among = post(layout_service, {"images": others}).json()["results"][1]
    assert alone["boxes"], "the page has boxes to compare"
    assert [b["cls_id"] for b in alone["boxes"]] == [b["cls_id"] for b in among["boxes"]]
    for a, b in zip(alone["boxes"], among["boxes"], strict=True):
        assert a["order"] == b["order"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-4)
        assert a["coordinate"] == pytest.approx(b["coordinate"], abs=1)


def test_the_overrides_change_what_comes_back(layout_service: str) -> None:
    """layout_shape_mode rect drops the outlines, a higher threshold keeps fewer boxes, NMS off
    keeps at least as many, per-class thresholds apply per class."""
    images = [page_url(11, 1240, 1754), page_url(12, 1754, 1240)]
    base = post(layout_service, {"images": images}).json()["results"]
    rect = post(layout_service, {"images": images, "layout_shape_mode": "rect"}).json()["results"]
    for result, (width, height) in zip(rect, [(1240, 1754), (1754, 1240)], strict=True):
        assert_page(result, width, height, outlines=False)
    assert [b["coordinate"] for r in rect for b in r["boxes"]] == [
        b["coordinate"] for r in base for b in r["boxes"]
    ]
    high = post(layout_service, {"images": images, "threshold": 0.45}).json()["results"]
    assert all(b["score"] > 0.45 for r in high for b in r["boxes"])
    assert sum(map(len, (r["boxes"] for r in high))) < sum(map(len, (r["boxes"] for r in base)))
    loose = post(layout_service, {"images": images, "layout_nms": False}).json()["results"]
    assert sum(len(r["boxes"]) for r in loose) >= sum(len(r["boxes"]) for r in base)
    text_only = {str(i): 1.0 for i in range(25)} | {"22": 0.2}
    per_class = post(layout_service, {"images": images, "threshold": text_only}).json()["results"]
    assert {b["label"] for r in per_class for b in r["boxes"]} <= {"text"}


def huge_png(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header says `width` x `height`: a decompression bomb's shape, refused
    from the header before any pixel is decoded."""
    out = io.BytesIO()
    Image.new("RGB", (1, 1), "white").save(out, format="PNG")
    data = bytearray(out.getvalue())
    header = b"IHDR" + struct.pack(">II", width, height) + bytes(data[24:29])
    data[12:29] = header
    data[29:33] = struct.pack(">I", zlib.crc32(header))
    return bytes(data)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


SMALL_PNG = png(Image.new("RGB", (8, 8), "white"))
BAD_BODIES: dict[str, tuple[Any, str | None, str]] = {
    # name: (body, param, code)
    "a JSON array": ([1, 2], None, "invalid_value"),
    "no images": ({"threshold": 0.3}, "images", "invalid_value"),
    "empty images": ({"images": []}, "images", "invalid_value"),
    "an image that is not a string": ({"images": [42]}, "images.0", "invalid_value"),
    "too many images": (
        {"images": [data_url(SMALL_PNG, "image/png")] * 33},
        "images",
        "too_many_images",
    ),
    "an https URL": ({"images": ["https://example.com/a.png"]}, "images.0", "invalid_image"),
    "a non-image data URL": (
        {"images": [f"data:text/plain;base64,{b64(b'hello')}"]},
        "images.0",
        "invalid_image",
    ),
    "bad base64": (
        {"images": ["data:image/png;base64,!!!not base64!!!"]},
        "images.0",
        "invalid_image",
    ),
    "a corrupt image": (
        {"images": [f"data:image/png;base64,{b64(SMALL_PNG[:40])}"]},
        "images.0",
        "invalid_image",
    ),
    "not an image at all": (
        {"images": [f"data:image/jpeg;base64,{b64(b'x' * 300)}"]},
        "images.0",
        "invalid_image",
    ),
    "a huge image": (
        {"images": [data_url(huge_png(9000, 9000), "image/png")]},
        "images.0",
        "image_too_large",
    ),
    "an unknown field": ({"images": ["x"], "layout_nmss": True}, "layout_nmss", "invalid_value"),
    "threshold a string": ({"images": ["x"], "threshold": "high"}, "threshold", "invalid_value"),
    "threshold above 1": ({"images": ["x"], "threshold": 2}, "threshold", "invalid_value"),
    "threshold of an unknown class": (
        {"images": ["x"], "threshold": {"99": 0.5}},
        "threshold",
        "invalid_value",
    ),
    "layout_nms a string": (
        {"images": ["x"], "layout_nms": "yes"},
        "layout_nms",
        "invalid_value",
    ),
    "unclip ratio of three": (
        {"images": ["x"], "layout_unclip_ratio": [1, 2, 3]},
        "layout_unclip_ratio",
        "invalid_value",
    ),
    "unclip ratio negative": (
        {"images": ["x"], "layout_unclip_ratio": -1},
        "layout_unclip_ratio",
        "invalid_value",
    ),
    "merge mode unknown": (
        {"images": ["x"], "layout_merge_bboxes_mode": "biggest"},
        "layout_merge_bboxes_mode",
        "invalid_value",
    ),
    "merge mode of a class unknown": (
        {"images": ["x"], "layout_merge_bboxes_mode": {"3": "all"}},
        "layout_merge_bboxes_mode.3",
        "invalid_value",
    ),
    "shape mode unknown": (
        {"images": ["x"], "layout_shape_mode": "circle"},
        "layout_shape_mode",
        "invalid_value",
    ),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_input_is_a_400_in_openai_shape_and_the_service_keeps_serving(
    layout_service: str, name: str
) -> None:
    """Each bad body: 400, OpenAI's error shape naming the field and a code; then a good page
    is still answered."""
    body, param, code = BAD_BODIES[name]
    response = post(layout_service, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"]
    good = post(layout_service, {"images": [data_url(SMALL_PNG, "image/png")]})
    assert good.status_code == 200


def test_a_body_that_is_not_json_is_a_400(layout_service: str) -> None:
    """Not JSON (and not UTF-8): 400 `invalid_json`."""
    for content in (b"{", b"\xff\xfe", b""):
        response = httpx.post(f"{layout_service}/v1/layout", content=content, timeout=30)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid_json"


def test_health_ready_and_metrics(layout_service: str) -> None:
    """/health and /ready answer 200 once warm; /metrics is Prometheus text with the batching
    metrics; an unknown path is a 404 in OpenAI's shape."""
    assert httpx.get(f"{layout_service}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{layout_service}/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    metrics = httpx.get(f"{layout_service}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "ocrvl_layout_batch_size_bucket",
        "ocrvl_layout_queue_wait_seconds_bucket",
        "ocrvl_layout_page_seconds_bucket",
        "ocrvl_layout_pages_total",
        "ocrvl_layout_forward_passes_total",
        'ocrvl_layout_requests_total{outcome="ok"}',
        "ocrvl_layout_ready 1.0",
        "ocrvl_layout_held_pages 0.0",  # every request before this one answered
    ):
        assert name in metrics.text
    missing = httpx.get(f"{layout_service}/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
