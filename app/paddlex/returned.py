"""The pages a client sends back to `/restructure-pages`, read as PaddleX reads them.

`from_pruned` is the serving app's `_to_original_result` with `restructure_pages`'
`_conver_blocks_to_obj` (PaddleX 3.7): each block's `#` heading marks cut, figures given back
their paths. What PaddleX would fail on with a 500 (a missing key) is a 422 naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from app.documents.blocks import image_path
from app.errors import InvalidRequest
from app.paddlex.restructure import Block, Page

REQUIRED = ("page_count", "width", "height", "model_settings")
SETTINGS = ("use_doc_preprocessor", "use_layout_detection")
HEADING = re.compile(r"^#+\s")


def from_pruned(pruned: dict[str, Any], index: int) -> Page:
    """A `prunedResult` sent back (`_conver_blocks_to_obj`): `#` marks cut from each block's
    start, figures given back their paths; 422 naming a field PaddleX would fail on."""
    where = f"pages[{index}].prunedResult"
    for name in REQUIRED:
        if name not in pruned:
            raise _missing(f"{where}.{name}")
    settings = _settings(pruned, where)
    for name, flag in (("doc_preprocessor_res", "use_doc_preprocessor"),
                       ("layout_det_res", "use_layout_detection")):  # fmt: skip
        if settings[flag] and name not in pruned:
            raise _missing(f"{where}.{name}")
    width = pruned["width"]
    if isinstance(width, list):
        width = width[0] if width else None
    if type(width) not in (int, float) or width <= 0:
        raise _missing(f"{where}.width")
    blocks = pruned.get("parsing_res_list", [])
    if not isinstance(blocks, list):
        raise _missing(f"{where}.parsing_res_list")
    chart = bool(settings.get("use_chart_recognition", False))
    made = [_block(item, f"{where}.parsing_res_list[{i}]", chart) for i, item in enumerate(blocks)]
    rest = {k: v for k, v in pruned.items() if k != "parsing_res_list"}
    return Page(rest, made)


def _settings(pruned: dict[str, Any], where: str) -> dict[str, Any]:
    """The page's `model_settings`, with what the restructuring reads of it checked."""
    settings = pruned["model_settings"]
    if not isinstance(settings, dict):
        raise _missing(f"{where}.model_settings")
    for name in SETTINGS:
        if name not in settings:
            raise _missing(f"{where}.model_settings.{name}")
    labels = settings.get("markdown_ignore_labels", [])
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise _missing(f"{where}.model_settings.markdown_ignore_labels")
    return settings


def _block(item: Any, where: str, chart: bool) -> Block:
    try:
        label, bbox, content = item["block_label"], item["block_bbox"], item["block_content"]
        x1, y1, x2, y2 = (float(v) for v in bbox)
    except (KeyError, TypeError, ValueError):
        raise InvalidRequest(
            f"`{where}` must be a block: block_label, block_bbox [x1, y1, x2, y2], block_content",
            param=where,
            code="invalid_value",
        ) from None
    if not isinstance(label, str) or not isinstance(content, str):
        raise InvalidRequest(f"`{where}` has a label or content that is not a string", param=where)
    block = Block(label, list(bbox), HEADING.sub("", content, count=1), item.get("group_id"))
    block.polygon = item.get("block_polygon_points")
    if isinstance(item.get("image"), dict):
        block.image = str(item["image"].get("path"))
    elif label in ("image", "seal") or (label == "chart" and not chart):
        block.image = image_path(label, (x1, y1, x2, y2))
    return block


def _missing(where: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{where}` is missing or malformed: send back the `prunedResult` /layout-parsing gave",
        param=where,
        code="missing_required_parameter",
    )
