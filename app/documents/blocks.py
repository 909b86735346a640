"""The block rules PaddleX's PaddleOCR-VL pipeline applies after its layout model (pure Python).

Each function names the PaddleX function it mirrors (PaddleX 3.7, `paddlex/inference/
pipelines/paddleocr_vl/`: `pipeline.py`, `uilts.py`; `layout_parsing/utils.py`):

    filter_overlaps  drop tiny, overlapping and `reference` boxes   uilts.filter_overlap_boxes
    figures          the page's image/figure/seal regions          utils.gather_imgs
    window           a box's crop window, as numpy slicing clips   CropByBoxes.__call__
    merge            adjacent text blocks read as one crop         uilts.merge_blocks
    ask              the prompt per label (sent, or an image)      pipeline._paddleocr_vl_
                                                                   collect_page_vlm_entries_core
    figure_tokens    figures inside a table, as `[F<n>]` tokens    uilts.tokenize_figure_of_table
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.documents import polygons
from app.documents.layout_options import LayoutOptions

IMAGE_LABELS = ("image", "header_image", "footer_image")  # pipeline.IMAGE_LABELS
# layout_parsing/setting.py BLOCK_LABEL_MAP["image_labels"]
FIGURE_LABELS = ("image", "figure", "seal")
VISUALS = {"image", "table", "seal", "chart"}
PROMPTS = {
    "table": "Table Recognition:",
    "chart": "Chart Recognition:",
    "formula": "Formula Recognition:",
    "seal": "Seal Recognition:",
    "text": "OCR:",
}
SMALLEST_TOKEN_FIGURE = 25  # a figure this small in a table is dropped, not tokenized


@dataclass(frozen=True, slots=True)
class Box:
    """One layout box as the layout service hands it over (coordinates in page pixels)."""

    cls_id: int
    label: str
    score: float
    coordinate: tuple[float, float, float, float]
    order: int | None = None
    polygon: tuple[tuple[float, float], ...] | None = None

    @property
    def bbox(self) -> list[int]:
        """The box as PaddleX's blocks show it (`list(map(int, bbox))`)."""
        return [int(v) for v in self.coordinate]


@dataclass(frozen=True, slots=True)
class Figure:
    """An image/figure/seal region of the page (clamped), and its markdown path."""

    path: str
    label: str
    coordinate: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Slot:
    """A block after merging: box `index`, its group, and the crops its image is made of."""

    index: int
    group: int | None  # PaddleX's group_id (None: never grouped)
    members: tuple[int, ...] = ()  # the boxes merged into this block's image (empty: none)
    aligns: tuple[str, ...] = field(default=())


def image_path(label: str, coordinate: Sequence[float]) -> str:
    """utils.construct_img_path: `imgs/img_in_<label>_box_<x1>_<y1>_<x2>_<y2>.jpg`."""
    x1, y1, x2, y2 = (int(v) for v in coordinate)
    return f"imgs/img_in_{label}_box_{x1}_{y1}_{x2}_{y2}.jpg"


def _small_overlap(a: Sequence[float], b: Sequence[float]) -> float:
    """uilts._compute_pairwise_overlap_small for one pair: intersection / smaller area."""
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    small = min(_area(a), _area(b))
    return width * height / small if small > 0 else 0.0


def filter_overlaps(boxes: Sequence[Box], shape_mode: str) -> list[Box]:
    """uilts.filter_overlap_boxes: no `reference` boxes, none under 6 px a side, and of two
    boxes overlapping by more than 70 % of the smaller (50 % for an inline formula) one goes."""
    kept = [box for box in boxes if box.label != "reference"]
    areas = [_area(box.coordinate) for box in kept]
    dropped: set[int] = set()
    for i, first in enumerate(kept):
        x1, y1, x2, y2 = first.coordinate
        if x2 - x1 < 6 or y2 - y1 < 6:
            dropped.add(i)
        for j in range(i + 1, len(kept)):
            if i in dropped or j in dropped:
                continue
            second = kept[j]
            ratio = _small_overlap(first.coordinate, second.coordinate)
            if "inline_formula" in (first.label, second.label) and ratio > 0.5:
                inline = ((i, first), (j, second))
                dropped.update(k for k, b in inline if b.label == "inline_formula")
                continue
            if ratio > 0.7 and not _kept_both(first, second, shape_mode):
                dropped.add(j if areas[i] >= areas[j] else i)
    return [box for i, box in enumerate(kept) if i not in dropped]


def _kept_both(first: Box, second: Box, shape_mode: str) -> bool:
    """Whether two boxes overlapping by more than 70 % both stay (filter_overlap_boxes)."""
    if shape_mode != "rect" and first.polygon is not None and second.polygon is not None:
        # PaddleX reads both polygons here (a box without one would raise KeyError there)
        ratio = polygons.overlap_small(first.polygon, second.polygon)
        if ratio is not None and ratio < 0.7:  # None: a polygon that is not simple
            return True
    labels = {first.label, second.label}
    return (
        bool(labels & VISUALS) and len(labels) > 1 and ("table" not in labels or labels <= VISUALS)
    )


def figures(boxes: Sequence[Box], width: int, height: int) -> list[Figure]:
    """utils.gather_imgs: the image/figure/seal boxes (before any filtering), clamped to the
    page; their paths keep the unclamped coordinates."""
    found = []
    for box in boxes:
        if box.label not in FIGURE_LABELS:
            continue
        x1, y1, x2, y2 = (int(v) for v in box.coordinate)
        x1, x2 = max(0, min(x1, width)), max(0, min(x2, width))
        y1, y2 = max(0, min(y1, height)), max(0, min(y2, height))
        if x2 > x1 and y2 > y1:
            found.append(Figure(image_path(box.label, box.coordinate), box.label, (x1, y1, x2, y2)))
    return found


def window(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """The crop `img[ymin:ymax, xmin:xmax]` of CropByBoxes, as (left, top, right, bottom)
    after numpy's slicing rules (negative ends count from the far side, ends are clipped)."""
    x1, y1, x2, y2 = (int(v) for v in box.coordinate)
    left, right, _ = slice(x1, x2).indices(width)
    top, bottom, _ = slice(y1, y2).indices(height)
    return left, top, max(right, left), max(bottom, top)


def image_labels(options: LayoutOptions) -> tuple[str, ...]:
    """Labels kept as images, never sent (get_layout_parsing_results' `image_labels`); image
    blocks are read with "OCR:" when `ocr_images` (`use_ocr_for_image_block`)."""
    labels = [] if options.ocr_images else list(IMAGE_LABELS)
    if not options.chart:
        labels.append("chart")
    if not options.seal:
        labels.append("seal")
    return tuple(labels)


def shown_labels(options: LayoutOptions) -> tuple[str, ...]:
    """Labels whose crop the result keeps as an image (`vis_image_labels`)."""
    return (*IMAGE_LABELS, "seal", *(() if options.chart else ("chart",)))


def ask(label: str, options: LayoutOptions) -> str | None:
    """The prompt a block of `label` is read with, or None when it is kept as an image
    (_paddleocr_vl_collect_page_vlm_entries_core; every label gets the pipeline's default
    min/max pixels in PaddleX 1.5, so the bounds are the caller's)."""
    if label in image_labels(options):
        return None
    if label == "table":
        return PROMPTS["table"]
    if label == "chart" and options.chart:
        return PROMPTS["chart"]
    if "formula" in label and label != "formula_number":
        return PROMPTS["formula"]
    if label == "seal" and options.seal:
        return PROMPTS["seal"]
    return PROMPTS["text"]


def bounds(prompt: str, options: LayoutOptions, default: tuple[int, int]) -> tuple[int, int]:
    """The (min, max) pixels a block read with `prompt` goes with: its kind's from `pixels`
    (`ocr`, `table`, `chart`, `formula`, `seal`: `vlmExtraArgs`' `ocr_min_pixels`, …), else
    the document's."""
    kind = next((name for name, text in PROMPTS.items() if text == prompt), "text")
    chosen = (options.pixels or {}).get("ocr" if kind == "text" else kind)
    return (chosen[0], chosen[1]) if chosen else default


def merge(
    boxes: Sequence[Box], sizes: Sequence[tuple[int, int]], keep_apart: Sequence[str]
) -> list[Slot]:
    """uilts.merge_blocks: consecutive `text` blocks side by side, or one above the other and
    aligned on one edge next to a figure or table, become one block read from one image.

    `sizes` are the crops' (width, height); `keep_apart` the labels never merged (the image
    labels and `table`). Returns the blocks in PaddleX's resulting order.
    """
    candidates = [i for i, box in enumerate(boxes) if box.label not in keep_apart]
    groups: list[tuple[list[int], list[str]]] = []
    for n, index in enumerate(candidates):
        if n and (align := _joins(boxes, index, candidates[n - 1], keep_apart)) is not None:
            groups[-1][0].append(index)
            groups[-1][1].append(align)
        else:
            groups.append(([index], []))
    starts = {members[0]: (members, aligns) for members, aligns in groups}
    slots: list[Slot] = []
    used: set[int] = set()
    index = 0
    while index < len(boxes):
        group = starts.get(index)
        if group is None or any(i in used for i in group[0]):
            if boxes[index].label in keep_apart and index not in used:
                slots.append(Slot(index, None))
                used.add(index)
            index += 1
            continue
        members, aligns = group
        width = max(sizes[i][0] for i in members)
        height = sum(sizes[i][1] for i in members)
        if (height / width if width else float("inf")) >= 3:  # too tall: read one by one
            slots += [Slot(i, None) for i in members]
        else:
            slots.append(Slot(members[0], members[0], tuple(members), tuple(aligns)))
            slots += [Slot(i, members[0]) for i in members[1:]]
        used.update(members)
        between = [i for i in range(members[0] + 1, members[-1]) if boxes[i].label in keep_apart]
        slots += [Slot(i, None) for i in between]
        used.update(between)
        index = members[-1] + 1
    return slots


def _joins(
    boxes: Sequence[Box], index: int, previous: int, keep_apart: Sequence[str]
) -> str | None:
    """How block `index` joins the block before it (its alignment), or None."""
    box, prev = boxes[index].coordinate, boxes[previous].coordinate
    texts = boxes[index].label == boxes[previous].label == "text"
    overlap = _projection(box, prev)
    beside = box[0] - prev[2] < max(prev[2] - prev[0], box[2] - box[0]) * 0.3
    if overlap == 0 and texts and box[0] > prev[2] and box[1] < prev[3] and beside:
        return "center"  # side by side
    if overlap > 0 and texts and box[3] >= prev[1]:
        close = abs(box[1] - prev[3]) < max(prev[3] - prev[1], box[3] - box[1]) * 0.5
        left, right = abs(box[0] - prev[0]) <= 5, abs(box[2] - prev[2]) <= 5
        if close and (left ^ right) and _near_visual(boxes, index, previous, keep_apart):
            return "left" if left else "right"
    return None


def _projection(a: Sequence[float], b: Sequence[float]) -> float:
    """utils.calculate_projection_overlap_ratio (horizontal, union)."""
    overlap = min(a[2], b[2]) - max(a[0], b[0])
    if overlap <= 0:
        return 0
    union = max(a[2], b[2]) - min(a[0], b[0])
    return overlap / union if union > 0 else 0.0


def _near_visual(
    boxes: Sequence[Box], index: int, previous: int, keep_apart: Sequence[str]
) -> bool:
    """merge_blocks' overlapwith_other_box: the two blocks' joint box meets a kept-apart one."""
    a, b = boxes[previous].coordinate, boxes[index].coordinate
    joint = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
    for i, other in enumerate(boxes):
        if i in (index, previous) or other.label not in keep_apart:
            continue
        o = other.coordinate
        inter = max(0.0, min(joint[2], o[2]) - max(joint[0], o[0])) * max(
            0.0, min(joint[3], o[3]) - max(joint[1], o[1])
        )
        union = _area(joint) + _area(o) - inter  # calculate_overlap_ratio (union) > 0
        if union != 0 and inter / union > 0:
            return True
    return False


def _area(box: Sequence[float]) -> float:
    return abs((box[2] - box[0]) * (box[3] - box[1]))


def _token_numbers(count: int) -> list[int]:
    """tokenize_figure_of_table's gen_random_map, shuffled as PaddleX does (seed 1024)."""
    numbers: list[int] = []
    i = 0
    while len(numbers) < count:
        if not set(str(i)) & {"0", "1", "9"}:
            numbers.append(i)
        i += 1
    random.Random(1024).shuffle(numbers)  # noqa: S311 (PaddleX's own token numbering)
    return numbers


def figure_tokens(
    table: Sequence[float], found: Sequence[Figure]
) -> tuple[list[tuple[str, str, tuple[float, float, float, float]]], list[str]]:
    """uilts.tokenize_figure_of_table's plan: for the figures wholly inside the table, the
    token painted over each (token, figure path, box in the table's crop) and the paths of all
    of them (dropped from the page's blocks: the table shows them)."""
    numbers = _token_numbers(len(found))
    tokens, dropped = [], []
    tx1, ty1, tx2, ty2 = table
    for n, figure in enumerate(found):
        x1, y1, x2, y2 = figure.coordinate
        if not (x1 >= tx1 and y1 >= ty1 and x2 <= tx2 and y2 <= ty2):
            continue
        dropped.append(figure.path)
        if min(x2 - x1, y2 - y1) < SMALLEST_TOKEN_FIGURE:
            continue
        draw = (x1 - tx1, y1 - ty1, x2 - tx1, y2 - ty1)
        tokens.append((f"[F{numbers[n]}]", figure.path, draw))
    return tokens, dropped
