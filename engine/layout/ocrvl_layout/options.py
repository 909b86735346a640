"""A layout request's body: its images and the post-processing overrides, checked, with the
defaults of PaddleX's PaddleOCR-VL-1.5 pipeline (paddlex/configs/pipelines/PaddleOCR-VL-1.5.yaml,
SubModules.LayoutDetection)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ocrvl_layout.errors import InvalidRequest, quoted
from ocrvl_layout.shapes import SHAPE_MODES

MERGE_MODES = ("union", "large", "small")
# PaddleOCR-VL-1.5.yaml's layout_merge_bboxes_mode: "large" for charts, display and inline
# formulas, document and paragraph titles; "union" (nothing merged) for every other label.
DEFAULT_MERGE = {i: "union" for i in range(25)} | {
    3: "large",
    5: "large",
    6: "large",
    15: "large",
    17: "large",
}
FIELDS = (
    "images",
    "threshold",
    "layout_nms",
    "layout_unclip_ratio",
    "layout_merge_bboxes_mode",
    "layout_shape_mode",
    "orientation",
    "unwarp",
)

T = TypeVar("T")
Threshold = float | dict[int, float]
Ratio = tuple[float, float] | dict[int, tuple[float, float]]
MergeMode = str | dict[int, str]


@dataclass(frozen=True)
class LayoutOptions:
    """PaddleX's layout post-processing parameters, defaults as PaddleOCR-VL-1.5 runs them."""

    threshold: Threshold = 0.3
    layout_nms: bool = True
    layout_unclip_ratio: Ratio | None = (1.0, 1.0)
    layout_merge_bboxes_mode: MergeMode | None = field(default_factory=lambda: dict(DEFAULT_MERGE))
    layout_shape_mode: str = "auto"


@dataclass(frozen=True)
class LayoutRequest:
    """A checked `POST /v1/layout` body."""

    images: list[str]
    options: LayoutOptions
    orientation: bool = False  # each page's angle classified and the page turned upright
    unwarp: bool = False  # each page flattened (UVDoc)


def parse_request(body: Any, *, num_labels: int, max_images: int) -> LayoutRequest:
    """The request in `body` (decoded JSON), or InvalidRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body must be a JSON object; got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field {quoted(unknown[0])}; the fields are {', '.join(FIELDS)}",
            param=unknown[0][:100],
        )
    images = body.get("images")
    if not isinstance(images, list) or not images:
        raise InvalidRequest(
            "images must be a non-empty array of data:image/...;base64 URLs", param="images"
        )
    if len(images) > max_images:
        raise InvalidRequest(
            f"{len(images)} images in one request; at most {max_images} (--max-images)",
            param="images",
            code="too_many_images",
        )
    for i, image in enumerate(images):
        if not isinstance(image, str):
            raise InvalidRequest(f"images[{i}] must be a data: URL string", param=f"images.{i}")
    default, labels = LayoutOptions(), num_labels
    options = LayoutOptions(
        threshold=_field(body, "threshold", default.threshold, lambda v: _threshold(v, labels)),
        layout_nms=_field(body, "layout_nms", default.layout_nms, _nms),
        layout_unclip_ratio=_field(
            body, "layout_unclip_ratio", default.layout_unclip_ratio,
            lambda v: _unclip_ratio(v, labels),
        ),
        layout_merge_bboxes_mode=_field(
            body, "layout_merge_bboxes_mode", default.layout_merge_bboxes_mode,
            lambda v: _merge_mode(v, labels),
        ),
        layout_shape_mode=_field(body, "layout_shape_mode", default.layout_shape_mode, _shape_mode),
    )  # fmt: skip
    orientation = _field(body, "orientation", False, lambda v: _flag(v, "orientation"))
    unwarp = _field(body, "unwarp", False, lambda v: _flag(v, "unwarp"))
    return LayoutRequest(images, options, orientation, unwarp)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false; got {quoted(value)}", param=name)
    return value


def _field(body: dict[str, Any], name: str, default: T, check: Callable[[Any], T]) -> T:
    """The field checked, or the default where it is absent or null."""
    value = body.get(name)
    return default if value is None else check(value)


def _number(value: Any, name: str, *, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a number; got {quoted(value)}", param=name)
    if value < low or value > high or (low_open and value == low):
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise InvalidRequest(f"{name} must be in {bounds}; got {value}", param=name)
    return float(value)


def _per_class(value: dict[Any, Any], name: str, num_labels: int) -> dict[int, Any]:
    """A {class id: value} object's keys as ints in [0, num_labels)."""
    out: dict[int, Any] = {}
    for key, item in value.items():
        try:
            cls_id = int(key)
        except (TypeError, ValueError):
            cls_id = -1
        if not 0 <= cls_id < num_labels or str(cls_id) != str(key).strip():
            raise InvalidRequest(
                f"{name}'s keys must be class ids 0..{num_labels - 1}; got {quoted(key)}",
                param=name,
            )
        out[cls_id] = item
    return out


def _threshold(value: Any, num_labels: int) -> Threshold:
    if isinstance(value, dict):
        per_class = _per_class(value, "threshold", num_labels)
        return {k: _number(v, f"threshold.{k}", low=0, high=1) for k, v in per_class.items()}
    return _number(value, "threshold", low=0, high=1)


def _nms(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(
            f"layout_nms must be true or false; got {quoted(value)}", param="layout_nms"
        )
    return value


def _pair(value: Any, name: str) -> tuple[float, float]:
    if isinstance(value, list) and len(value) == 2:
        width, height = (_number(v, name, low=0, high=1e6, low_open=True) for v in value)
        return (width, height)
    if isinstance(value, list):
        raise InvalidRequest(f"{name} must be [width ratio, height ratio]", param=name)
    ratio = _number(value, name, low=0, high=1e6, low_open=True)
    return (ratio, ratio)


def _unclip_ratio(value: Any, num_labels: int) -> Ratio:
    name = "layout_unclip_ratio"
    if isinstance(value, dict):
        per_class = _per_class(value, name, num_labels)
        return {k: _pair(v, f"{name}.{k}") for k, v in per_class.items()}
    return _pair(value, name)


def _mode(value: Any, name: str) -> str:
    if value not in MERGE_MODES:
        raise InvalidRequest(
            f"{name} must be one of {', '.join(MERGE_MODES)}; got {quoted(value)}", param=name
        )
    return str(value)


def _merge_mode(value: Any, num_labels: int) -> MergeMode:
    name = "layout_merge_bboxes_mode"
    if isinstance(value, dict):
        per_class = _per_class(value, name, num_labels)
        return {k: _mode(v, f"{name}.{k}") for k, v in per_class.items()}
    return _mode(value, name)


def _shape_mode(value: Any) -> str:
    if value not in SHAPE_MODES:
        raise InvalidRequest(
            f"layout_shape_mode must be one of {', '.join(SHAPE_MODES)}; got {quoted(value)}",
            param="layout_shape_mode",
        )
    return str(value)
