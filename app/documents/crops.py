"""A page's blocks cut out for the model: runs in the worker processes, never on the event loop.

    layout_page(source, index, …)             the page at full resolution for the layout service,
                                              and its pixels for `prepare`
    prepare(source, index, boxes, options, …) every block: its crop (polygon-masked), merged with
                                              its neighbours, margins trimmed (formulas), figures
                                              in tables tokenized, guarded, JPEG-encoded; and
                                              the page's figure images

The page is rasterised once: the worker that renders it keeps its pixels in a file (6 MB for
a 144-dpi A4 page) for `prepare`, while the page waits for the layout service; the gateway
holds at most OCRVL_PREPROCESS_HELD_BYTES of them (app/documents/workers.py), and a page past
that is rendered again for `prepare`.
Crops go to the model as PaddleX sends them (a Pillow JPEG at Pillow's default quality, at the
crop's own size, with the pixel bounds in `mm_processor_kwargs`), so that the engine sees the
very pixels it would see behind PaddleX's pipeline. Each step names the PaddleX function it mirrors.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageFont, ImageMath

from app.documents import blocks, masks, raster, resize
from app.documents.blocks import Box, Slot
from app.documents.layout_options import LayoutOptions

LAYOUT_JPEG_QUALITY = 95  # the page for the layout service (its model reads 800x800 anyway)
MIN_SIDE = 4  # PaddleOCR#17378: a 1- or 3-px side reads as a channel axis in some processors
MAX_ASPECT = 200  # vLLM's PaddleOCR-VL processor refuses a longer ratio with a 400
WHITE = (255, 255, 255)


@dataclass(frozen=True, slots=True)
class LayoutPage:
    """The page as the layout service gets it."""

    url: str  # JPEG data URL
    width: int
    height: int


@dataclass(slots=True)
class PlannedBlock:
    """One block of the page, ready to be read (or kept as an image)."""

    label: str
    bbox: list[int]
    score: float
    group: int | None
    polygon: list[list[float]] | None = None
    prompt: str | None = None  # None: not sent (kept as an image, merged into another, empty)
    url: str | None = None  # the crop the model reads (JPEG data URL)
    tokens: int = 0  # its visual tokens at its pixel bounds
    pixels: tuple[int, int] | None = None  # (min, max) pixels it is read with
    image_path: str | None = None  # the figure's markdown path (labels kept as images)
    dropped: bool = False  # a figure inside a table: shown by the table, not as a block
    token_map: dict[str, str] = field(default_factory=dict)  # a table's [F<n>] -> figure path
    drops: list[str] = field(default_factory=list)  # a table's figures (shown by it, not apart)
    guard: str | None = None  # how the crop was padded to be readable
    skipped: str | None = None  # why a block that would be read was not


@dataclass(slots=True)
class PagePlan:
    """Every block of the page in PaddleX's order, and the figure images its markdown uses."""

    width: int
    height: int
    blocks: list[PlannedBlock]
    images: dict[str, str]  # markdown path -> JPEG data URL (empty unless asked for)


def layout_page(
    source: raster.Source, index: int, lossless: bool = False, keep: raster.Keep | None = None
) -> tuple[LayoutPage, raster.Pixels | None]:
    """The page at full resolution as a JPEG data URL (coordinates come back in its pixels);
    `lossless`: a PNG, for a page the service sends back corrected, whose blocks are then cut
    from what it sent back (so they are the page's own pixels, as PaddleX cuts them). With it,
    its pixels kept under `keep`: `prepare` cuts the blocks from them."""
    page = raster.page_image(source, index)
    return _layout_page(page, lossless), raster.Pixels.kept(page, keep)


def layout_page_of(
    source: raster.Source, index: int, pixels: raster.Pixels, lossless: bool = False
) -> LayoutPage:
    """`layout_page` of pixels already rendered (the results cache's hash rendered them)."""
    return _layout_page(pixels.image(source, index), lossless)


def _layout_page(page: Image.Image, lossless: bool) -> LayoutPage:
    fmt = "PNG" if lossless else "JPEG"
    url = resize.data_url(resize.encode(page, fmt), fmt)
    return LayoutPage(url, page.width, page.height)


def _opened(url: str) -> Image.Image:
    """The corrected page the layout service sent back (its own PNG, RGB)."""
    with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as image:
        return image.convert("RGB")


def jpeg_url(image: Image.Image) -> str:
    """`image` as PaddleX sends a crop: Pillow's JPEG at its default quality."""
    out = io.BytesIO()
    image.save(out, format="JPEG")
    return resize.data_url(out.getvalue())


def prepare(
    source: raster.Source,
    index: int,
    boxes: Sequence[Box],
    options: LayoutOptions,
    cut_from: str | raster.Pixels | None = None,
) -> PagePlan:
    """Every block of page `index` under the layout `boxes` (the service's, in reading order),
    cut from `cut_from`: the page the layout service turned or flattened (its data URL), the
    pixels its layout page was made from, or (None) the page rendered again."""
    page = _page(source, index, cut_from)
    kept = blocks.filter_overlaps(boxes, options.shape_mode)
    cuts = _Cuts(
        page, kept, [cut(page, box, options.shape_mode) for box in kept],
        blocks.figures(boxes, page.width, page.height), options, source,
    )  # fmt: skip
    keep_apart = (*blocks.image_labels(options), "table")
    if options.merge_blocks:
        slots = blocks.merge(kept, [image.size for image in cuts.images], keep_apart)
    else:
        slots = [Slot(i, None) for i in range(len(kept))]
    planned = [_block(slot, cuts) for slot in slots]
    dropped = {path for block in planned for path in block.drops}
    for block in planned:
        block.dropped = block.image_path is not None and block.image_path in dropped
    images = _images(cuts, planned, slots) if options.images else {}
    return PagePlan(page.width, page.height, planned, images)


def _page(source: raster.Source, index: int, cut_from: str | raster.Pixels | None) -> Image.Image:
    if isinstance(cut_from, str):
        return _opened(cut_from)
    return cut_from.image(source, index) if cut_from else raster.page_image(source, index)


@dataclass(frozen=True, slots=True)
class _Cuts:
    """One page's crops and what making its blocks needs."""

    page: Image.Image
    kept: Sequence[Box]  # the boxes after the overlap rules
    images: Sequence[Image.Image]  # their crops
    found: Sequence[blocks.Figure]  # the page's figures (all boxes)
    options: LayoutOptions
    source: raster.Source


def cut(page: Image.Image, box: Box, shape_mode: str) -> Image.Image:
    """CropByBoxes: the box's crop, outside its polygon painted white (shape modes but rect)."""
    left, top, right, bottom = blocks.window(box, page.width, page.height)
    crop = page.crop((left, top, right, bottom))
    if shape_mode == "rect" or box.polygon is None or crop.width == 0 or crop.height == 0:
        return crop
    x1, y1 = int(box.coordinate[0]), int(box.coordinate[1])
    points = [(int(x) - x1, int(y) - y1) for x, y in box.polygon]  # np.int32 truncates
    inside = masks.fill(points, crop.width, crop.height)
    mask = Image.frombytes("L", crop.size, bytes(inside)).point([0, 255] + [255] * 254)
    return Image.composite(crop, Image.new("RGB", crop.size, WHITE), mask)


def _block(slot: Slot, cuts: _Cuts) -> PlannedBlock:
    """pipeline._paddleocr_vl_collect_page_vlm_entries_core for one block after merging."""
    options, source, found = cuts.options, cuts.source, cuts.found
    box = cuts.kept[slot.index]
    polygon = (
        [list(p) for p in box.polygon]
        if box.polygon is not None and options.shape_mode != "rect"
        else None
    )
    block = PlannedBlock(box.label, box.bbox, box.score, slot.group, polygon)
    image: Image.Image | None = cuts.images[slot.index]
    if slot.members:
        image = merge_images([cuts.images[i] for i in slot.members], slot.aligns)
    elif slot.group is not None:
        image = None  # merged into the group's first block
    if image is not None and box.label in blocks.shown_labels(options):
        block.image_path = blocks.image_path(box.label, box.coordinate)
    prompt = blocks.ask(box.label, options) if image is not None else None
    if prompt is None or image is None:
        return block
    if image.width == 0 or image.height == 0:
        block.skipped = "its crop is empty (the box lies outside the page)"
        return block
    if prompt == blocks.PROMPTS["table"]:
        tokens, block.drops = blocks.figure_tokens(box.coordinate, found)
        image = paint_tokens(image, tokens)
        block.token_map = {token: path for token, path, _ in tokens}
    elif prompt == blocks.PROMPTS["formula"]:
        trimmed = crop_margin(image)
        if trimmed.height > 2 and trimmed.width > 2:
            image = trimmed
    image, block.guard = guard(image)
    block.prompt, block.url = prompt, jpeg_url(image)
    block.pixels = blocks.bounds(prompt, options, (source.min_pixels, source.max_pixels))
    height, width = resize.smart_resize(image.height, image.width, *block.pixels)
    block.tokens = (height // resize.FACTOR) * (width // resize.FACTOR)
    return block


def merge_images(images: Sequence[Image.Image], aligns: Sequence[str]) -> Image.Image:
    """uilts.merge_images: one above the other on white, each step aligned as asked."""
    if len(images) == 1:
        return images[0]
    offsets = [0] * len(images)
    merged = images[0].width
    for i in range(1, len(images)):
        width = images[i].width
        step = max(merged, width)
        if aligns[i - 1] == "center":
            shift, offsets[i] = (step - merged) // 2, (step - width) // 2
        elif aligns[i - 1] == "right":
            shift, offsets[i] = step - merged, step - width
        else:
            shift, offsets[i] = 0, 0
        for k in range(i):
            offsets[k] += shift
        merged = step
    canvas = Image.new("RGB", (merged, sum(image.height for image in images)), WHITE)
    top = 0
    for image, left in zip(images, offsets, strict=True):
        canvas.paste(image, (left, top))
        top += image.height
    return canvas


def crop_margin(image: Image.Image) -> Image.Image:
    """uilts.crop_margin: the crop cut to its ink (grey <= 200 after stretching to 0-255),
    with OpenCV's BGR2GRAY (fixed-point 14-bit weights)."""
    red, green, blue = image.split()
    gray = ImageMath.lambda_eval(
        lambda a: (a["r"] * 4899 + a["g"] * 9617 + a["b"] * 1868 + 8192) >> 14,
        r=red.convert("I"), g=green.convert("I"), b=blue.convert("I"),
    )  # fmt: skip
    gray = gray.convert("L")
    low, high = gray.getextrema()
    if low == high:
        return image
    ink = [255 if int((v - low) / (high - low) * 255) <= 200 else 0 for v in range(256)]
    box = gray.point(ink).getbbox()
    return image if box is None else image.crop(box)


def paint_tokens(
    image: Image.Image, tokens: Sequence[tuple[str, str, tuple[float, float, float, float]]]
) -> Image.Image:
    """uilts.paint_token, approximately: each figure's box white with its `[F<n>]` token in
    black. PaddleX writes the token with OpenCV's Hershey font, which Pillow does not have:
    the box is the same, the glyphs are Pillow's (so a table with figures in it is the one
    crop whose pixels differ from PaddleX's)."""
    if not tokens:
        return image
    image = image.copy()
    draw = ImageDraw.Draw(image)
    for token, _, box in tokens:
        x1, y1, x2, y2 = (int(v) for v in box)
        draw.rectangle((x1, y1, x2, y2), fill=WHITE)
        side = max(min(x2 - x1, y2 - y1), 1)
        font = ImageFont.load_default(size=max(int(side * 0.9 / max(len(token) * 0.6, 1)), 6))
        left, top, right, bottom = draw.textbbox((0, 0), token, font=font)
        x = x1 + (x2 - x1 - (right - left)) // 2 - left
        y = y1 + (y2 - y1 - (bottom - top)) // 2 - top
        draw.text((x, y), token, fill=(0, 0, 0), font=font)
    return image


def guard(image: Image.Image) -> tuple[Image.Image, str | None]:
    """A crop the model's processor cannot take, padded with white until it can: sides of
    fewer than MIN_SIDE pixels (PaddleOCR#17378) and ratios over MAX_ASPECT (vLLM's 400)."""
    width, height = image.size
    new_height = max(height, MIN_SIDE, math.ceil(width / MAX_ASPECT))
    new_width = max(width, MIN_SIDE, math.ceil(new_height / MAX_ASPECT))
    if (new_width, new_height) == (width, height):
        return image, None
    canvas = Image.new("RGB", (new_width, new_height), WHITE)
    canvas.paste(image, ((new_width - width) // 2, (new_height - height) // 2))
    why = "its sides must be 4 px at least" if min(width, height) < MIN_SIDE else "its ratio"
    note = (
        f"padded with white from {width}x{height} to {new_width}x{new_height} px "
        f"({why}{' and at most 200:1' if why == 'its ratio' else ''} for the model)"
    )
    return canvas, note


def _images(cuts: _Cuts, planned: Sequence[PlannedBlock], slots: Sequence[Slot]) -> dict[str, str]:
    """The markdown's images (MarkdownConverter: every shown block's crop, then the page's
    figures, unmasked, which win for a path both have)."""
    images: dict[str, Image.Image] = {}
    for block, slot in zip(planned, slots, strict=True):
        if block.image_path is not None and not block.dropped:
            images[block.image_path] = cuts.images[slot.index]
    for figure in cuts.found:
        images[figure.path] = cuts.page.crop(figure.coordinate)
    return {path: jpeg_url(image) for path, image in images.items() if image.width and image.height}
