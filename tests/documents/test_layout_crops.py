"""Blocks cut out of a page (app/documents/crops.py), checked pixel by pixel: polygon masks,
trimmed formula margins, merged text, figures in tables, the padding guard, the encoding."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from app.documents import crops
from app.documents.blocks import Box
from app.documents.layout_options import LayoutOptions
from app.documents.raster import Source
from app.documents.sniff import sniff

RED, WHITE, BLACK = (200, 30, 30), (255, 255, 255), (0, 0, 0)


def decoded(url: str) -> Image.Image:
    """The image of a base64 data URL."""
    head, _, payload = url.partition(",")
    assert head == "data:image/jpeg;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB")


def test_a_polygon_paints_what_lies_outside_it_white() -> None:
    """With a triangle's polygon, the crop keeps the pixels inside it and is white outside;
    in rect mode the polygon is ignored."""
    page = Image.new("RGB", (100, 100), RED)
    box = Box(0, "text", 0.9, (10, 10, 50, 50), polygon=((10, 10), (49, 10), (10, 49)))
    masked = crops.cut(page, box, "auto")
    assert masked.size == (40, 40)
    assert masked.getpixel((1, 1)) == RED
    assert masked.getpixel((38, 38)) == WHITE
    assert masked.getpixel((39, 0)) == RED  # on the outline: OpenCV fills it
    assert crops.cut(page, box, "rect").getpixel((38, 38)) == RED


def test_a_formula_crop_loses_its_white_margins() -> None:
    """crop_margin cuts a crop to its ink: a 20x10 black mark at (30, 15) in white."""
    image = Image.new("RGB", (100, 50), WHITE)
    ImageDraw.Draw(image).rectangle((30, 15, 49, 24), fill=BLACK)
    trimmed = crops.crop_margin(image)
    assert trimmed.size == (20, 10)
    assert trimmed.tobytes() == bytes(BLACK) * 200
    blank = Image.new("RGB", (10, 10), WHITE)
    assert crops.crop_margin(blank) is blank  # nothing to trim to


def test_merged_blocks_stack_on_white_aligned_as_asked() -> None:
    """Two crops merge one above the other: right-aligned, the narrow one is pushed right."""
    wide, narrow = Image.new("RGB", (30, 5), RED), Image.new("RGB", (10, 5), BLACK)
    merged = crops.merge_images([wide, narrow], ["right"])
    assert merged.size == (30, 10)
    assert merged.getpixel((29, 7)) == BLACK
    assert merged.getpixel((0, 7)) == WHITE
    centred = crops.merge_images([narrow, wide], ["center"])
    assert centred.getpixel((10, 2)) == BLACK  # the narrow one moved to the middle
    assert centred.getpixel((9, 2)) == WHITE


@pytest.mark.parametrize(
    ("size", "padded"),
    [((11, 3), (11, 4)), ((3, 11), (4, 11)), ((1210, 6), (1210, 7)), ((6, 1300), (7, 1300))],
)
def test_a_crop_the_model_cannot_take_is_padded_with_white(
    size: tuple[int, int], padded: tuple[int, int]
) -> None:
    """Sides under 4 px (PaddleOCR#17378) and ratios over 200:1 (vLLM's 400) are padded with
    white around the crop, which keeps its pixels; the block says so."""
    image = Image.new("RGB", size, RED)
    guarded, note = crops.guard(image)
    assert guarded.size == padded
    assert note is not None
    assert f"from {size[0]}x{size[1]} to {padded[0]}x{padded[1]} px" in note
    left, top = (padded[0] - size[0]) // 2, (padded[1] - size[1]) // 2
    assert guarded.crop((left, top, left + size[0], top + size[1])).tobytes() == image.tobytes()
    assert max(padded) / min(padded) <= 200


def test_a_readable_crop_is_left_alone() -> None:
    """A 5x5 crop and a 200:1 one go as they are."""
    for size in ((5, 5), (800, 4)):
        image = Image.new("RGB", size, RED)
        assert crops.guard(image) == (image, None)


def test_crops_go_as_pillow_jpegs_at_its_default_quality() -> None:
    """PaddleX's client sends `Image.save(format="JPEG")`: the same bytes here."""
    image = Image.new("RGB", (40, 20), RED)
    ImageDraw.Draw(image).line((0, 0, 40, 20), fill=BLACK)
    out = io.BytesIO()
    image.save(out, format="JPEG")
    assert crops.jpeg_url(image) == "data:image/jpeg;base64," + base64.b64encode(
        out.getvalue()
    ).decode("ascii")


def page_file(tmp_path: Path) -> Source:
    """A 400x300 PNG page: a red figure inside a table area, a formula, two text lines."""
    page = Image.new("RGB", (400, 300), WHITE)
    draw = ImageDraw.Draw(page)
    draw.rectangle((220, 20, 260, 60), fill=RED)  # a figure in the table (200,10)-(390,140)
    draw.rectangle((60, 200, 99, 219), fill=BLACK)  # a formula's ink in (20,190)-(180,240)
    draw.text((10, 10), "first line", fill=BLACK)
    path = tmp_path / "page.png"
    page.save(path)
    return Source(str(path), sniff(path.read_bytes()[:1024]), 144, 112_896, 1_003_520, 10**8)


def test_a_page_is_planned_block_by_block(tmp_path: Path) -> None:
    """prepare(): the table is read with its figure as a token (the figure block leaves the
    page), the formula from its ink only, the image kept with its path, the text merged (a
    block alone keeps its own index as its group, as PaddleX's merge leaves it)."""
    boxes = [
        Box(22, "text", 0.9, (5, 5, 100, 25)),
        Box(22, "text", 0.9, (110, 5, 190, 25)),
        Box(21, "table", 0.9, (200, 10, 390, 140)),
        Box(14, "image", 0.9, (220, 20, 261, 61)),
        Box(5, "display_formula", 0.9, (20, 190, 180, 240)),
        Box(14, "image", 0.9, (10, 250, 60, 290)),
    ]
    plan = crops.prepare(page_file(tmp_path), 0, boxes, LayoutOptions())
    assert (plan.width, plan.height) == (400, 300)
    by_label = [(block.label, block.prompt, block.group) for block in plan.blocks]
    assert by_label == [
        ("text", "OCR:", 0), ("text", None, 0), ("table", "Table Recognition:", None),
        ("image", None, None), ("display_formula", "Formula Recognition:", 4),
        ("image", None, None),
    ]  # fmt: skip
    text, _, table, inner, formula, figure = plan.blocks
    assert decoded(text.url or "").size == (95, 40)  # the two lines, stacked (PaddleX does)
    assert inner.dropped
    assert not figure.dropped
    assert list(table.token_map.values()) == ["imgs/img_in_image_box_220_20_261_61.jpg"]
    painted = decoded(table.url or "")
    assert painted.getpixel((22, 12))[0] > 200  # the red figure is white under its token
    assert painted.getpixel((22, 12))[1] > 200
    assert decoded(formula.url or "").size == (40, 20)  # its ink only
    assert figure.image_path == "imgs/img_in_image_box_10_250_60_290.jpg"
    assert set(plan.images) == {inner.image_path, figure.image_path}
    assert formula.tokens == (252 // 28) * (476 // 28)  # 40x20 grown to min_pixels: 476x252
    assert all(block.url is None for block in (inner, figure))
