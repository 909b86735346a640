"""What a client asks of the layout pipeline (`/v1/ocr`'s `layout` and its overrides), checked.

The defaults are PaddleX's PaddleOCR-VL-1.5 pipeline's (`paddlex/configs/pipelines/
PaddleOCR-VL-1.5.yaml`; 1.6's file differs only in the model's name): chart and seal
recognition off, adjacent text blocks merged, `markdown_ignore_labels` as below, markdown
"pretty" (centred HTML for images and captions), formula numbers not merged into formulas.
The layout model's own overrides (threshold, NMS, unclip ratio, merge modes, shape mode) go to
the layout service as they are; unset, the service applies its model's defaults.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from app.errors import InvalidRequest, quoted

MODES = ("auto", "on", "off")
SHAPE_MODES = ("auto", "rect", "quad", "poly")
MERGE_MODES = ("union", "large", "small")
DEFAULT_IGNORE = (
    "number",
    "footnote",
    "header",
    "header_image",
    "footer",
    "footer_image",
    "aside_text",
)
MAX_LABELS = 64
CLASSES = 25  # PP-DocLayoutV3's labels: per-class overrides name class ids 0..24
Number = float | int


@dataclass(frozen=True, slots=True)
class LayoutOptions:
    """The checked options of one document's layout pipeline (JSON-able: jobs store it)."""

    threshold: float | dict[str, float] | None = None  # by class id (as a string) when a dict
    nms: bool | None = None
    unclip_ratio: float | list[float] | dict[str, Any] | None = None
    merge_bboxes_mode: str | dict[str, str] | None = None
    shape_mode: str = "auto"
    ignore_labels: tuple[str, ...] = DEFAULT_IGNORE
    chart: bool = False  # charts read with "Chart Recognition:" (else kept as images)
    seal: bool = False  # seals read with "Seal Recognition:" (else kept as images)
    merge_blocks: bool = True  # adjacent text blocks read as one crop
    pretty: bool = True  # markdown as PaddleX's default (centred HTML); False: plain markdown
    formula_number: bool = False  # a formula's number merged into it as \tag*{}
    images: bool = True  # the figure crops the markdown references come back as data URLs
    ocr_images: bool = False  # image blocks read with "OCR:" too, their text under the figure
    # pixel bounds by prompt ("ocr", "table", "chart", "formula", "seal"): [min, max]; a
    # prompt left out takes the document's (PaddleX's `vlmExtraArgs` `ocr_min_pixels`, …)
    pixels: dict[str, list[int]] | None = None
    orientation: bool = False  # each page's orientation classified and turned upright first
    unwarp: bool = False  # each page flattened first (UVDoc), in the layout service

    @property
    def preprocessing(self) -> bool:
        """Whether the layout service corrects the page before finding its layout."""
        return self.orientation or self.unwarp

    def service_overrides(self) -> dict[str, Any]:
        """The overrides the layout service takes (issue 36's API), the unset ones left out."""
        fields = {
            "threshold": self.threshold,
            "layout_nms": self.nms,
            "layout_unclip_ratio": self.unclip_ratio,
            "layout_merge_bboxes_mode": self.merge_bboxes_mode,
            "layout_shape_mode": self.shape_mode,
            "orientation": self.orientation or None,  # sent only when asked
            "unwarp": self.unwarp or None,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def as_dict(self) -> dict[str, Any]:
        """For a job's stored spec."""
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> LayoutOptions:
        """Back from `as_dict` (a job's spec)."""
        return cls(**{**value, "ignore_labels": tuple(value.get("ignore_labels", DEFAULT_IGNORE))})


def parse_layout(fields: dict[str, Any]) -> tuple[str, LayoutOptions]:
    """`layout` (auto, on, off) and the pipeline's options, from form fields (strings) or JSON;
    400 naming the field for anything malformed."""
    mode = _choice(fields, "layout", MODES)
    shape = _choice(fields, "layout_shape_mode", SHAPE_MODES)
    options = LayoutOptions(
        threshold=_threshold(fields),
        nms=_flag(fields, "layout_nms", None),
        unclip_ratio=_unclip(fields),
        merge_bboxes_mode=_merge_mode(fields),
        shape_mode=shape,
        ignore_labels=_labels(fields),
        chart=bool(_flag(fields, "chart_recognition", False)),
        seal=bool(_flag(fields, "seal_recognition", False)),
        pretty=bool(_flag(fields, "prettify_markdown", True)),
        formula_number=bool(_flag(fields, "show_formula_number", False)),
        images=bool(_flag(fields, "markdown_images", True)),
        ocr_images=bool(_flag(fields, "ocr_image_blocks", False)),
        orientation=bool(_flag(fields, "orientation", False)),
        unwarp=bool(_flag(fields, "unwarp", False)),
    )
    return mode, options


def _choice(fields: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (case-insensitive), the first when the field is unset or empty."""
    value = fields.get(name)
    if value is None or value == "":
        return choices[0]
    if not isinstance(value, str) or value.lower() not in choices:
        raise InvalidRequest(
            f"`{name}` must be one of {', '.join(choices)}; got {quoted(value)}",
            param=name,
            code="invalid_value",
        )
    return value.lower()


def _flag(fields: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = fields.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise InvalidRequest(
        f"`{name}` must be true or false; got {quoted(value)}", param=name, code="invalid_value"
    )


def _structured(fields: dict[str, Any], name: str) -> Any:
    """The field's value; a form field's JSON object or array (`{"22": 0.5}`) decoded."""
    value = fields.get(name)
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            raise InvalidRequest(
                f"`{name}` is not valid JSON: {quoted(value)}", param=name, code="invalid_value"
            ) from None
    return None if value == "" else value


def _number(value: Any, name: str, low: float, high: float, what: str) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(
            f"`{name}` must be {what}; got {quoted(value)}", param=name, code="invalid_value"
        )
    if not low <= value <= high:
        raise InvalidRequest(
            f"`{name}` must be {what}; got {value!r}", param=name, code="invalid_value"
        )
    return float(value)


def _per_class(value: dict[str, Any], name: str) -> dict[str, Any]:
    """A per-class override's keys: class ids (0, 1, …), as strings."""
    for key in value:
        if not str(key).isdigit() or int(key) >= CLASSES:
            raise InvalidRequest(
                f"`{name}`'s keys must be the layout model's class ids (0 to {CLASSES - 1}); "
                f"got {quoted(key)}",
                param=name,
                code="invalid_value",
            )
    return {str(int(key)): item for key, item in value.items()}


def _threshold(fields: dict[str, Any]) -> float | dict[str, float] | None:
    name, what = "layout_threshold", "a number from 0 to 1, or {class id: number}"
    value = _structured(fields, name)
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _number(v, name, 0, 1, what) for k, v in _per_class(value, name).items()}
    return _number(value, name, 0, 1, what)


def _ratio(value: Any, name: str) -> float | list[float]:
    what = "a number above 0 (up to 10), a [width, height] pair, or {class id: either}"
    if isinstance(value, list):
        if len(value) != 2:
            raise InvalidRequest(
                f"`{name}` must be {what}; got {quoted(value)}", param=name, code="invalid_value"
            )
        return [_number(v, name, 1e-6, 10, what) for v in value]
    return _number(value, name, 1e-6, 10, what)


def _unclip(fields: dict[str, Any]) -> float | list[float] | dict[str, Any] | None:
    name = "layout_unclip_ratio"
    value = _structured(fields, name)
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _ratio(v, name) for k, v in _per_class(value, name).items()}
    return _ratio(value, name)


def _merge_mode(fields: dict[str, Any]) -> str | dict[str, str] | None:
    name = "layout_merge_bboxes_mode"
    value = _structured(fields, name)
    if value is None:
        return None
    items = _per_class(value, name) if isinstance(value, dict) else {"": value}
    for item in items.values():
        if not isinstance(item, str) or item.lower() not in MERGE_MODES:
            raise InvalidRequest(
                f"`{name}` must be one of {', '.join(MERGE_MODES)}, or {{class id: one of them}}; "
                f"got {quoted(item)}",
                param=name,
                code="invalid_value",
            )
    if isinstance(value, dict):
        return {k: str(v).lower() for k, v in items.items()}
    return str(value).lower()


def _labels(fields: dict[str, Any]) -> tuple[str, ...]:
    name = "markdown_ignore_labels"
    if name not in fields or fields[name] is None:
        return DEFAULT_IGNORE
    value = _structured(fields, name)
    if isinstance(fields[name], str) and not isinstance(value, list):
        value = [part.strip() for part in fields[name].split(",") if part.strip()]
    if value is None:
        value = []
    if not isinstance(value, list) or len(value) > MAX_LABELS:
        raise InvalidRequest(
            f"`{name}` must be a list of labels (JSON, or comma-separated in a form field), at "
            f"most {MAX_LABELS}; got {quoted(fields[name])}",
            param=name,
            code="invalid_value",
        )
    for label in value:
        if not isinstance(label, str) or not label or len(label) > 64:
            raise InvalidRequest(
                f"`{name}` holds a bad label: {quoted(label)}", param=name, code="invalid_value"
            )
    return tuple(value)
