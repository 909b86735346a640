"""PaddleX's layout post-processing of PP-DocLayoutV3's candidates, ported: the boxes its layout
model hands the PaddleOCR-VL-1.5 pipeline.

Each step mirrors PaddleX 3.7 (paddlex/inference/models/layout_analysis/processors.py,
`LayoutAnalysisProcess.apply` and `__call__`; the NMS and containment helpers of
paddlex/inference/models/object_detection/processors.py), in its order and with its numpy calls,
so scores, ties and orders come out the same (tests/engine/test_layout_postprocess.py runs
PaddleX's own code beside it):

    threshold (global or per class) → layout NMS → the large-image rule → merge modes by
    containment → reading order → outline by shape mode → unclip → clip to the page, ints →
    order numbers (labels PaddleX leaves unnumbered get None)

The pipeline calls its layout model with `filter_overlap_boxes=False` and filters overlaps
itself, so that filter is not applied here. One deliberate difference: PaddleX's single merge
mode ("large" or "small" for every label) drops boxes without dropping their outlines, which
then belong to the wrong boxes; here an outline goes with its box.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ocrvl_layout.boxes import Candidates, polygons
from ocrvl_layout.options import LayoutOptions
from ocrvl_layout.shapes import outline

# PaddleX's SKIP_ORDER_LABELS: blocks outside the reading flow get no order number
SKIP_ORDER_LABELS = frozenset(
    {
        "figure_title",
        "vision_footnote",
        "image",
        "chart",
        "table",
        "header",
        "header_image",
        "footer",
        "footer_image",
        "footnote",
        "aside_text",
    }
)


def layout_boxes(
    found: Candidates, labels: list[str], options: LayoutOptions
) -> list[dict[str, Any]]:
    """One page's final boxes, in reading order, as PaddleX's layout model returns them."""
    boxes = candidate_rows(found)
    outlines = None
    if options.layout_shape_mode != "rect":
        outlines = [None if p is None else np.asarray(p) for p in polygons(found)]
    return number(apply(boxes, outlines, labels, (found.width, found.height), options))


def candidate_rows(found: Candidates) -> np.ndarray:
    """The candidates as PaddleX's transformers engine formats them: rows of
    cls_id, score, x1, y1, x2, y2, order (`_format_layout_transformers_output`)."""
    return np.concatenate(
        [
            found.labels[:, None].astype(np.float32),
            found.scores[:, None].astype(np.float32),
            found.boxes.astype(np.float32),
            found.order[:, None].astype(np.float32),
        ],
        axis=1,
    )


def apply(
    boxes: np.ndarray,
    outlines: list[np.ndarray | None] | None,
    labels: list[str],
    size: tuple[int, int],
    options: LayoutOptions,
) -> list[dict[str, Any]]:
    """`LayoutAnalysisProcess.apply` for candidates with outlines (transformers' engine)."""
    boxes = boxes.copy()
    boxes[:, 2:6] = np.round(boxes[:, 2:6]).astype(int)
    keep = _by_threshold(boxes, options.threshold)
    boxes, outlines = _take(boxes, outlines, keep)
    if options.layout_nms:
        boxes, outlines = _take(boxes, outlines, nms(boxes[:, :6], 0.6, 0.98))
    boxes, outlines = _take(boxes, outlines, _large_image_rule(boxes, labels, size))
    if options.layout_merge_bboxes_mode:
        formula = labels.index("formula") if "formula" in labels else None
        keep = merge_keep(boxes, options.layout_merge_bboxes_mode, formula)
        boxes, outlines = _take(boxes, outlines, np.flatnonzero(keep))
    if boxes.size == 0:
        return []
    boxes, outlines = _take(boxes, outlines, np.argsort(boxes[:, 6]))
    boxes = boxes[:, :6]
    shapes: list[np.ndarray] | None = None
    if outlines is not None:
        shapes = []
        for box, polygon in zip(boxes, outlines, strict=True):
            previous = shapes[-1] if shapes else None
            shapes.append(outline(box[2:6], polygon, options.layout_shape_mode, previous))
    if options.layout_unclip_ratio:
        boxes = unclip(boxes, options.layout_unclip_ratio)
    return restructure(boxes, labels, size, shapes)


def _take(boxes: np.ndarray, outlines: list[Any] | None, index: Any) -> tuple[np.ndarray, Any]:
    index = np.asarray(index, dtype=np.int64)
    return np.array(boxes[index]), None if outlines is None else [outlines[i] for i in index]


def _by_threshold(boxes: np.ndarray, threshold: float | dict[int, float]) -> np.ndarray:
    """The rows above the threshold; per class, grouped by class id as PaddleX regroups them."""
    if not isinstance(threshold, dict):
        return np.flatnonzero((boxes[:, 1] > threshold) & (boxes[:, 0] > -1))
    kept = []
    for cat_id in np.unique(boxes[:, 0]):
        rows = np.flatnonzero(boxes[:, 0] == cat_id)
        limit = threshold.get(int(cat_id), 0.5)
        kept.extend(rows[(boxes[rows, 1] > limit) & (boxes[rows, 0] > -1)])
    return np.asarray(kept, dtype=np.int64)


def nms(boxes: np.ndarray, iou_same: float = 0.6, iou_diff: float = 0.95) -> list[int]:
    """Greedy NMS, one IoU for the same class and one across classes (PaddleX's `nms` and `iou`,
    with their +1 pixel areas; the IoUs computed at once, in the same float32 steps)."""
    x1, y1, x2, y2 = (boxes[:, k] for k in range(2, 6))
    inter_w = np.minimum(x2[:, None], x2[None, :]) - np.maximum(x1[:, None], x1[None, :]) + 1
    inter_h = np.minimum(y2[:, None], y2[None, :]) - np.maximum(y1[:, None], y1[None, :]) + 1
    inter = np.maximum(0, inter_w) * np.maximum(0, inter_h)
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    iou = inter / (area[:, None] + area[None, :] - inter)
    indices = list(np.argsort(boxes[:, 1])[::-1])
    selected = []
    while indices:
        current = indices[0]
        selected.append(int(current))
        rest = np.asarray(indices[1:], dtype=np.int64)
        same = boxes[rest, 0] == boxes[current, 0]
        # PaddleX compares a float32 IoU with a Python float: NumPy 2 makes that a float32 test
        limit = np.where(same, np.float32(iou_same), np.float32(iou_diff))
        indices = list(rest[iou[current, rest] < limit])
    return selected


def _large_image_rule(boxes: np.ndarray, labels: list[str], size: tuple[int, int]) -> np.ndarray:
    """Drops `image` boxes that cover most of the page (82 % of a landscape page, 93 % of a
    portrait one), unless that would drop every box."""
    everything = np.arange(len(boxes))
    if len(boxes) <= 1 or "image" not in labels:
        return everything
    width, height = size
    area_limit = (0.82 if width > height else 0.93) * width * height
    image = boxes[:, 0] == labels.index("image")
    clipped_w = np.minimum(width, boxes[:, 4]) - np.maximum(0, boxes[:, 2])
    clipped_h = np.minimum(height, boxes[:, 5]) - np.maximum(0, boxes[:, 3])
    kept = np.flatnonzero(~image | (clipped_w * clipped_h <= area_limit))
    return kept if len(kept) else everything


def containment(
    boxes: np.ndarray, formula: int | None, category: int | None = None, mode: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Which boxes contain another, which are contained (90 % of their area inside), among the
    pairs the mode looks at (PaddleX's `check_containment` and `is_contained`)."""
    n = len(boxes)
    cls, x1, y1, x2, y2 = (boxes[:, k] for k in (0, 2, 3, 4, 5))
    inter_w = np.maximum(
        0, np.minimum(x2[:, None], x2[None, :]) - np.maximum(x1[:, None], x1[None, :])
    )
    inter_h = np.maximum(
        0, np.minimum(y2[:, None], y2[None, :]) - np.maximum(y1[:, None], y1[None, :])
    )
    area = (x2 - x1) * (y2 - y1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(area[:, None] > 0, inter_w * inter_h / area[:, None], 0)
    pairs = ~np.eye(n, dtype=bool)  # i inside j
    if formula is not None:
        pairs &= ~((cls[:, None] == formula) & (cls[None, :] != formula))
    if category is not None and mode == "large":
        pairs &= cls[None, :] == category
    elif category is not None and mode == "small":
        pairs &= cls[:, None] == category
    contained = pairs & (ratio >= 0.9)
    return contained.any(axis=0).astype(int), contained.any(axis=1).astype(int)


def merge_keep(boxes: np.ndarray, mode: str | dict[int, str], formula: int | None) -> np.ndarray:
    """The boxes a merge mode keeps: "large" drops boxes inside another, "small" drops boxes that
    hold another (unless they are inside one themselves); per class, the class is the outer box
    for "large" and the inner one for "small"."""
    keep = np.ones(len(boxes), dtype=bool)
    modes = mode.items() if isinstance(mode, dict) else [(None, mode)]
    for category, how in modes:
        if how == "union":
            continue
        contains_other, contained_by_other = containment(boxes[:, :6], formula, category, how)
        if how == "large":
            keep &= contained_by_other == 0
        else:
            keep &= (contains_other == 0) | (contained_by_other == 1)
    return keep


def unclip(
    boxes: np.ndarray, ratio: tuple[float, float] | dict[int, tuple[float, float]]
) -> np.ndarray:
    """Boxes grown (or shrunk) about their centres (PaddleX's `unclip_boxes`)."""
    if isinstance(ratio, dict):
        rows = []
        for box in boxes:
            class_id, score, x1, y1, x2, y2 = box
            if class_id not in ratio:
                rows.append(box)
                continue
            width_ratio, height_ratio = ratio[class_id]
            width, height = x2 - x1, y2 - y1
            center_x, center_y = x1 + width / 2, y1 + height / 2
            new_w, new_h = width * width_ratio, height * height_ratio
            rows.append(
                [
                    class_id,
                    score,
                    center_x - new_w / 2,
                    center_y - new_h / 2,
                    center_x + new_w / 2,
                    center_y + new_h / 2,
                ]
            )
        return np.array(rows)
    widths, heights = boxes[:, 4] - boxes[:, 2], boxes[:, 5] - boxes[:, 3]
    new_w, new_h = widths * ratio[0], heights * ratio[1]
    center_x, center_y = boxes[:, 2] + widths / 2, boxes[:, 3] + heights / 2
    return np.column_stack(
        (
            boxes[:, 0],
            boxes[:, 1],
            center_x - new_w / 2,
            center_y - new_h / 2,
            center_x + new_w / 2,
            center_y + new_h / 2,
        )
    )


def restructure(
    boxes: np.ndarray, labels: list[str], size: tuple[int, int], shapes: list[np.ndarray] | None
) -> list[dict[str, Any]]:
    """Rows as PaddleX's box dicts, clipped to the page in whole pixels (`restructured_boxes`);
    a box empty after clipping is dropped."""
    width, height = size
    out = []
    for index, box in enumerate(boxes):
        x1, y1 = int(max(0, box[2])), int(max(0, box[3]))
        x2, y2 = int(min(width, box[4])), int(min(height, box[5]))
        if x2 <= x1 or y2 <= y1:
            continue
        entry: dict[str, Any] = {
            "cls_id": int(box[0]),
            "label": labels[int(box[0])],
            "score": float(box[1]),
            "coordinate": [x1, y1, x2, y2],
        }
        if shapes is not None:
            entry["polygon_points"] = shapes[index].tolist()
        out.append(entry)
    return out


def number(boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reading-order numbers from 1, None for the labels outside the flow (`update_order_index`)."""
    order = 1
    for box in boxes:
        if box["label"] in SKIP_ORDER_LABELS:
            box["order"] = None
        else:
            box["order"] = order
            order += 1
    return boxes
