"""The block rules after the layout model (app/documents/blocks.py, polygons.py), each pinned on
boxes drawn for it: which boxes go, which merge, which prompt each label gets."""

from __future__ import annotations

import pytest

from app.documents import blocks, masks, polygons
from app.documents.blocks import Box, Slot
from app.documents.layout_options import LayoutOptions


def b(label: str, x1: float, y1: float, x2: float, y2: float, **more: object) -> Box:
    """A layout box."""
    return Box(0, label, 0.9, (x1, y1, x2, y2), **more)  # type: ignore[arg-type]


def labels(boxes: list[Box]) -> list[str]:
    return [box.label for box in boxes]


def test_reference_boxes_and_boxes_under_six_pixels_are_dropped() -> None:
    """PaddleX drops every `reference` box and any box under 6 px wide or high."""
    kept = blocks.filter_overlaps(
        [b("text", 0, 0, 100, 20), b("reference", 0, 30, 100, 50), b("text", 0, 60, 5, 80),
         b("text", 0, 90, 100, 95), b("number", 0, 100, 6, 106)],
        "auto",
    )  # fmt: skip
    assert [box.coordinate for box in kept] == [(0, 0, 100, 20), (0, 100, 6, 106)]


def test_of_two_boxes_overlapping_past_seventy_percent_the_smaller_goes() -> None:
    """A text box 80 % inside another text box is dropped; at 60 % both stay."""
    big, inside = b("text", 0, 0, 100, 100), b("text", 0, 0, 50, 40)
    assert blocks.filter_overlaps([big, inside], "rect") == [big]
    assert blocks.filter_overlaps([inside, big], "rect") == [big]
    partly = b("text", 70, 0, 120, 20)  # 30x20 of its 50x20 overlaps: 60 %
    assert blocks.filter_overlaps([big, partly], "rect") == [big, partly]


def test_an_inline_formula_goes_at_half_overlap_whatever_its_size() -> None:
    """An inline formula overlapping anything by more than 50 % of the smaller is dropped,
    even when it is the larger box."""
    text = b("text", 0, 0, 100, 20)
    formula = b("inline_formula", 40, 0, 160, 30)  # overlap 60x20 = 60 % of the text box
    assert blocks.filter_overlaps([text, formula], "rect") == [text]
    assert blocks.filter_overlaps([formula, text], "rect") == [text]


@pytest.mark.parametrize(
    ("first", "second", "both_stay"),
    [
        ("image", "text", True),  # a caption inside a figure stays
        ("table", "chart", True),
        ("image", "seal", True),
        ("table", "text", False),  # text inside a table goes
        ("text", "paragraph_title", False),
    ],
)
def test_figures_keep_what_overlaps_them_but_tables_do_not(
    first: str, second: str, both_stay: bool
) -> None:
    """PaddleX keeps both of two overlapping boxes when one is a figure, chart, seal or table
    and the other is not a table's text."""
    outer, inner = b(first, 0, 0, 200, 200), b(second, 10, 10, 100, 50)
    kept = blocks.filter_overlaps([outer, inner], "rect")
    assert labels(kept) == ([first, second] if both_stay else [first])


def test_polygons_that_barely_meet_keep_both_boxes_except_in_rect_mode() -> None:
    """Two boxes overlapping by 80 % whose polygons (two triangles) share little both stay,
    unless the shape mode is rect."""
    upper = b("text", 0, 0, 100, 100, polygon=((0, 0), (100, 0), (0, 100)))
    lower = b("text", 0, 10, 100, 90, polygon=((100, 10), (100, 90), (20, 90)))
    assert polygons.overlap_small(upper.polygon or (), lower.polygon or ()) == pytest.approx(
        0.0, abs=0.01
    )
    assert len(blocks.filter_overlaps([upper, lower], "auto")) == 2
    assert len(blocks.filter_overlaps([upper, lower], "rect")) == 1


def test_polygon_overlap_is_the_intersection_over_the_smaller_area() -> None:
    """Two unit squares shifted by half: 0.5; an L inside a square: 1.0; apart: 0."""
    square = ((0, 0), (2, 0), (2, 2), (0, 2))
    shifted = ((1, 0), (3, 0), (3, 2), (1, 2))
    ell = ((0, 0), (2, 0), (2, 1), (1, 1), (1, 2), (0, 2))
    assert polygons.overlap_small(square, shifted) == pytest.approx(0.5)
    assert polygons.overlap_small(ell, square) == pytest.approx(1.0)
    assert polygons.overlap_small(square, ((5, 5), (6, 5), (6, 6))) == 0.0
    assert polygons.overlap_small(((0, 0), (2, 2), (2, 0), (0, 2)), square) is None  # bowtie


def test_fill_sets_the_outline_and_the_inside_as_opencv_does() -> None:
    """A rectangle's polygon fills its crop; a triangle fills its lower-left half, its
    hypotenuse included (OpenCV draws the outline too)."""
    assert masks.fill([(0, 0), (4, 0), (4, 3), (0, 3)], 4, 3) == bytearray([1] * 12)
    triangle = masks.fill([(0, 0), (3, 3), (0, 3)], 4, 4)
    rows = [list(triangle[y * 4 : y * 4 + 4]) for y in range(4)]
    assert rows == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_window_clips_like_numpy_slicing() -> None:
    """A box past the page is cut at its edge; coordinates are truncated to integers."""
    assert blocks.window(b("text", 10.7, 5.2, 500, 90.9), 100, 80) == (10, 5, 100, 80)
    assert blocks.window(b("text", 120, 0, 200, 10), 100, 80) == (100, 0, 100, 10)


def test_text_blocks_side_by_side_merge_into_one() -> None:
    """Two text blocks on one line, 10 px apart, become one block (its first one's) read from
    one image; a title between keeps them apart."""
    left, right = b("text", 0, 0, 100, 20), b("text", 110, 2, 200, 22)
    sizes = [(100, 20), (90, 20)]
    assert blocks.merge([left, right], sizes, ("image", "table")) == [
        Slot(0, 0, (0, 1), ("center",)),
        Slot(1, 0),
    ]
    title = b("paragraph_title", 0, 40, 100, 60)
    merged = blocks.merge([left, title, right], [*sizes[:1], (100, 20), sizes[1]], ("table",))
    assert [slot.members for slot in merged] == [(0,), (1,), (2,)]


def test_stacked_text_merges_only_beside_a_figure_and_aligned_on_one_edge() -> None:
    """Two text blocks one above the other, left-aligned, whose joint box meets an image, merge
    (the image follows them); without the image they stay apart."""
    upper, lower = b("text", 0, 0, 100, 20), b("text", 0, 25, 80, 45)
    image = b("image", 90, 0, 300, 200)
    slots = blocks.merge([upper, image, lower], [(100, 20), (210, 200), (80, 20)], ("image",))
    assert slots == [Slot(0, 0, (0, 2), ("left",)), Slot(2, 0), Slot(1, None)]
    apart = blocks.merge([upper, lower], [(100, 20), (80, 20)], ("image",))
    assert [slot.members for slot in apart] == [(0,), (1,)]


def test_a_group_three_times_taller_than_wide_is_read_block_by_block() -> None:
    """Side-by-side blocks whose stacked crops are at least 3:1 tall are not merged."""
    left, right = b("text", 0, 0, 20, 40), b("text", 22, 0, 40, 40)
    assert blocks.merge([left, right], [(20, 40), (18, 40)], ("image",)) == [
        Slot(0, None),
        Slot(1, None),
    ]


@pytest.mark.parametrize(
    ("label", "chart", "seal", "prompt"),
    [
        ("text", False, False, "OCR:"),
        ("paragraph_title", False, False, "OCR:"),
        ("header", False, False, "OCR:"),
        ("formula_number", False, False, "OCR:"),
        ("table", False, False, "Table Recognition:"),
        ("display_formula", False, False, "Formula Recognition:"),
        ("inline_formula", False, False, "Formula Recognition:"),
        ("chart", False, False, None),
        ("chart", True, False, "Chart Recognition:"),
        ("seal", False, False, None),
        ("seal", False, True, "Seal Recognition:"),
        ("image", True, True, None),
        ("header_image", False, False, None),
        ("footer_image", False, False, None),
    ],
)
def test_each_label_gets_its_prompt_or_stays_an_image(
    label: str, chart: bool, seal: bool, prompt: str | None
) -> None:
    """The prompt per label, as PaddleX's pipeline picks it (None: kept as an image)."""
    assert blocks.ask(label, LayoutOptions(chart=chart, seal=seal)) == prompt


def test_figures_inside_a_table_become_tokens_and_leave_the_page() -> None:
    """A figure wholly inside a table gets a `[F<n>]` token painted over it (numbers without
    0, 1 or 9, shuffled as PaddleX's seed 1024 does), one under 25 px is only dropped, one
    outside stays."""
    found = [
        blocks.Figure("imgs/a.jpg", "image", (110, 110, 150, 150)),
        blocks.Figure("imgs/b.jpg", "image", (160, 160, 170, 170)),
        blocks.Figure("imgs/c.jpg", "image", (400, 400, 450, 450)),
    ]
    tokens, dropped = blocks.figure_tokens((100, 100, 300, 300), found)
    assert dropped == ["imgs/a.jpg", "imgs/b.jpg"]
    assert [(path, box) for _, path, box in tokens] == [("imgs/a.jpg", (10, 10, 50, 50))]
    assert tokens[0][0] in {"[F2]", "[F3]", "[F4]"}  # gen_random_map(3) shuffled
    assert blocks.image_path("image", (1.9, 2, 3, 4)) == "imgs/img_in_image_box_1_2_3_4.jpg"
