"""The gateway's layout pipeline gives what PaddleX's own PaddleOCR-VL-1.5 pipeline gives.

For every page of the corpus (tests/fidelity/pages.py: PNG, JPEG and PDF inputs) both sides get
the same layout boxes (stand-ins: tests/support/layout_standin.py for the gateway, PaddleX's
layout model replaced in tests/support/paddlex_fixed_layout.py) and the same answers (one
tests/support/standin_vlm.py per side, whose answer depends only on the prompt and the image).
The page's markdown and its block list must then be equal, and both sides must have asked the
model the same things (the same prompts with the same pixels), which proves the same crops.

PaddleX runs in `.venv-paddleocr` (`make paddleocr-venv`); without it the tier is skipped,
saying so, except under CI, where it fails.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from tests.fidelity.conftest import RUNS, Gateway, PaddleX, Side
from tests.fidelity.pages import DOCUMENTS, Document
from tests.support.standin_vlm import answer, image_digest

PAGES = [
    (name, index)
    for name, _, members in DOCUMENTS
    if name in RUNS["corpus"].documents
    for index in range(len(members))
]
PAGE_IDS = [f"{name}-p{index + 1}" for name, index in PAGES]
Requests = collections.Counter[tuple[Any, ...]]


def paddlex_blocks(page: dict[str, Any]) -> list[dict[str, Any]]:
    """PaddleX's block list (its JSON result's `parsing_res_list`), in the fields compared."""
    return [
        {
            "label": block["block_label"],
            "bbox": block["block_bbox"],
            "text": block["block_content"],
            "order": block["block_order"],
            "group": block["group_id"],
            "polygon": block.get("block_polygon_points"),
        }
        for block in page["blocks"]
    ]


def gateway_blocks(page: dict[str, Any]) -> list[dict[str, Any]]:
    """The gateway's block list (`/v1/ocr`'s `blocks`), in the fields compared."""
    return [
        {
            "label": block["label"],
            "bbox": block["bbox"],
            "text": block["text"],
            "order": block["order"],
            "group": block["group"],
            "polygon": block.get("polygon"),
        }
        for block in page["blocks"]
    ]


def gateway_images(page: dict[str, Any]) -> dict[str, list[int]]:
    """The figure crops the gateway's markdown references: path -> [width, height]."""
    return {path: list(image_digest(url)[1:3]) for path, url in page["images"].items()}


def requests(side: Side) -> Requests:
    """What a side asked its stand-in VLM: (prompt, pixels' digest, width, height), the
    `mm_processor_kwargs` and the sampling fields, each with how often."""
    return collections.Counter((r.key, r.mm_processor_kwargs, r.sampling) for r in side.received)


@pytest.mark.parametrize(("document", "index"), PAGES, ids=PAGE_IDS)
def test_markdown_equals_paddlex(
    paddlex: PaddleX, gateway: Gateway, document: str, index: int
) -> None:
    """The page's markdown is PaddleX's, character for character."""
    expected = paddlex.side("corpus").pages[(document, index)]["markdown"]
    assert gateway.side("corpus").pages[(document, index)]["markdown"] == expected


@pytest.mark.parametrize(("document", "index"), PAGES, ids=PAGE_IDS)
def test_blocks_equal_paddlex(
    paddlex: PaddleX, gateway: Gateway, document: str, index: int
) -> None:
    """The page's blocks are PaddleX's: label, bbox, text (a table's HTML), order, group,
    polygon."""
    expected = paddlex_blocks(paddlex.side("corpus").pages[(document, index)])
    assert gateway_blocks(gateway.side("corpus").pages[(document, index)]) == expected


@pytest.mark.parametrize(("document", "index"), PAGES, ids=PAGE_IDS)
def test_markdown_images_equal_paddlex(
    paddlex: PaddleX, gateway: Gateway, document: str, index: int
) -> None:
    """The page's figure crops (the images its markdown references) are PaddleX's: the same
    paths, the same sizes."""
    expected = paddlex.side("corpus").pages[(document, index)]["markdown_images"]
    assert gateway_images(gateway.side("corpus").pages[(document, index)]) == expected


def test_same_requests_to_the_model(paddlex: PaddleX, gateway: Gateway) -> None:
    """Both sides sent the model the same prompts with the same pixels (the same crops) and
    the same `mm_processor_kwargs`, each as often."""
    expected, got = requests(paddlex.side("corpus")), requests(gateway.side("corpus"))
    assert got == expected, (
        f"PaddleX asked {expected.total()} times, the gateway {got.total()}; "
        f"only PaddleX: {_shown(expected - got)}; only the gateway: {_shown(got - expected)}"
    )


def test_layout_service_gets_whole_pages(gateway: Gateway, documents: list[Document]) -> None:
    """The gateway asks the layout service about each page at its full size (the boxes come
    back in the pixels PaddleX crops from), in requests that keep to the service's API."""
    gateway.side("corpus")
    seen = collections.Counter(size for request in gateway.layout.seen for size in request.sizes)
    chosen = [doc for doc in documents if doc.name in RUNS["corpus"].documents]
    pages = collections.Counter(page.image.size for doc in chosen for page in doc.pages)
    assert not pages - seen, "a page the layout service never saw whole"
    assert not gateway.layout.complaints


def test_job_equals_paddlex(paddlex: PaddleX, gateway: Gateway) -> None:
    """A document job (`/v1/ocr/jobs`, read in the background lane) gives the pages PaddleX
    gives, from crops PaddleX sent too."""
    expected = paddlex.side("corpus")
    side = gateway.read_as_job(gateway.documents["book-pdf"])
    assert len(side.pages) == 3
    for key, page in side.pages.items():
        assert page["markdown"] == expected.pages[key]["markdown"], key
        assert gateway_blocks(page) == paddlex_blocks(expected.pages[key]), key
    assert not requests(side) - requests(expected), "the job sent crops PaddleX did not"


@pytest.mark.parametrize(
    ("fields", "variant"),
    [
        ({"prettify_markdown": "false"}, "markdown_plain"),
        ({"show_formula_number": "true"}, "markdown_numbered"),
    ],
    ids=["plain", "formula-numbers"],
)
def test_markdown_options_equal_paddlex(
    paddlex: PaddleX, gateway: Gateway, fields: dict[str, str], variant: str
) -> None:
    """Unprettified markdown (`save_to_markdown(pretty=False)`) and markdown with formula
    numbers merged in (`show_formula_number=True`) are PaddleX's too."""
    chosen = [gateway.documents[name] for name in ("formulas", "figures", "other_labels")]
    side = gateway.read(chosen, **fields)
    expected = paddlex.side("corpus").pages
    for key, page in side.pages.items():
        assert page["markdown"] == expected[key][variant], key
    assert any(expected[key][variant] != expected[key]["markdown"] for key in side.pages)


@pytest.mark.parametrize(
    ("run", "prompts"),
    [
        ("recognizing", {"Chart Recognition:", "Seal Recognition:"}),
        ("options", {"OCR:"}),
    ],
)
def test_options_equal_paddlex(
    paddlex: PaddleX, gateway: Gateway, run: str, prompts: set[str]
) -> None:
    """With PaddleX's options set alike, the pages are PaddleX's: `recognizing` reads charts
    and seals (`use_chart_recognition`, `use_seal_recognition`: other prompts, other markdown);
    `options` crops rectangles (`layout_shape_mode="rect"`: no polygon masks), leaves other
    labels out of the markdown (`markdown_ignore_labels`) and caps each answer
    (`max_new_tokens`, the gateway's `max_tokens`)."""
    expected, got = paddlex.side(run), gateway.side(run)
    assert got.pages.keys() == expected.pages.keys()
    for key, page in expected.pages.items():
        assert got.pages[key]["markdown"] == page["markdown"], key
        assert gateway_blocks(got.pages[key]) == paddlex_blocks(page), key
    assert requests(got) == requests(expected)
    assert prompts <= {r.prompt for r in expected.received}
    assert requests(expected) != requests(paddlex.side("corpus")) & requests(expected), (
        "the options changed nothing PaddleX asked"
    )


@pytest.mark.parametrize(
    ("run", "prompt", "label", "paddlex_size", "gateway_size"),
    [
        # `[F<n>]` drawn over the figure in Pillow's font, not OpenCV's Hershey
        ("table_figure", "Table Recognition:", "table", (860, 400), (860, 400)),
        # the formula's 3-px ink padded to 4 px (PaddleOCR#17378: vLLM answers 500 to 3 px)
        ("thin_formula", "Formula Recognition:", "display_formula", (201, 3), (201, 4)),
    ],
    ids=["table-figure", "thin-formula"],
)
def test_known_difference_is_one_crop(
    paddlex: PaddleX,
    gateway: Gateway,
    run: str,
    prompt: str,
    label: str,
    paddlex_size: tuple[int, int],
    gateway_size: tuple[int, int],
) -> None:
    """A table with a figure in it and a formula trimmed to 3 px are each read from a crop
    that differs from PaddleX's, on purpose or for want of OpenCV's font; every other request
    and every block that does not hang on that one answer are PaddleX's."""
    expected, got = paddlex.side(run), gateway.side(run)
    assert [(p, w, h) for (p, _, w, h), *_ in requests(expected) - requests(got)] == [
        (prompt, *paddlex_size)
    ]
    assert [(p, w, h) for (p, _, w, h), *_ in requests(got) - requests(expected)] == [
        (prompt, *gateway_size)
    ]
    [(key, page)] = expected.pages.items()
    wanted, blocks = paddlex_blocks(page), gateway_blocks(got.pages[key])
    assert _placed(blocks) == _placed(wanted)
    assert [b["label"] for b, w in zip(blocks, wanted, strict=True) if b != w] == [label]


def test_transparent_png_is_laid_on_white(paddlex: PaddleX, gateway: Gateway) -> None:
    """A PNG whose paper is transparent (black underneath): PaddleX's reader
    (`cv2.imdecode(…, IMREAD_COLOR)`) drops the alpha and crops the black page, the gateway
    lays it on white first (`resize.upright_rgb`) — a known difference. The same blocks are
    read with the same prompts from crops of the same sizes, only their pixels differ."""
    expected, got = paddlex.side("polygons-alpha"), gateway.side("polygons-alpha")
    assert _shapes(got) == _shapes(expected)
    assert not requests(expected) & requests(got), "no sent crop has PaddleX's pixels"
    [(key, page)] = expected.pages.items()
    assert _placed(gateway_blocks(got.pages[key])) == _placed(paddlex_blocks(page))


def test_corpus_exercises_paddlex_rules(paddlex: PaddleX) -> None:
    """The corpus makes PaddleX use the rules the pages were drawn for: without this, a page
    could stop covering one and the fidelity tests would still pass."""
    side = paddlex.side("corpus")
    pages, blocks = side.pages, {key: page["blocks"] for key, page in side.pages.items()}
    merged = blocks[("merged_paragraphs", 0)]
    groups = collections.Counter(b["group_id"] for b in merged)
    assert sorted(groups.values())[-2:] == [2, 3], "merged groups: 3 across, 2 beside a figure"
    tall = [b for b in merged if b["block_bbox"][3] == 1300]
    assert len({b["group_id"] for b in tall}) == 2, "a group too tall to merge stays apart"
    dropped = len(pages[("overlaps", 0)]["layout_boxes"]) - len(blocks[("overlaps", 0)])
    assert dropped == 7, "overlaps: smaller, later equal, reference, 5 px boxes, inline pair"
    assert len(blocks[("tables", 0)]) == len(pages[("tables", 0)]["layout_boxes"]) - 1
    tables = [
        b["block_content"] for page in blocks.values() for b in page if b["block_label"] == "table"
    ]
    assert any("colspan" in t for t in tables), "no table with a span"
    assert any(not t.startswith("<table>") for t in tables), "no table answer without tags"
    paragraphs = pages[("formulas", 0)]["markdown"].split("\n\n")
    numbers = [b for b in blocks[("formulas", 0)] if b["block_label"] == "formula_number"]
    assert len(numbers) == 2
    assert not any(b["block_content"] in paragraphs for b in numbers)
    assert "<img src=" in pages[("figures", 0)]["markdown"]
    header = next(b for b in blocks[("article", 0)] if b["block_label"] == "header")
    assert header["block_content"] not in pages[("article", 0)]["markdown"]
    answers = [answer(r.prompt, r.digest, r.width, r.height) for r in side.received]
    assert any(_loops(text) for text in answers), "no answer loops: truncation goes untested"
    assert any("\\(" in text for text in answers), "no \\( \\) answer: its rewrite goes untested"


def _shapes(side: Side) -> Requests:
    """A side's requests without the pixels: prompt, crop size, the other fields."""
    return collections.Counter(
        (r.prompt, r.width, r.height, r.mm_processor_kwargs, r.sampling) for r in side.received
    )


def _placed(blocks: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The blocks without their text: label, bbox, order, group."""
    return [(b["label"], b["bbox"], b["order"], b["group"]) for b in blocks]


def _loops(text: str) -> bool:
    words = text.split()
    return len(words) > 20 and len(set(words)) <= 3


def _shown(counter: Requests, limit: int = 8) -> str:
    items = [f"{key[0]!r} {key[2]}x{key[3]} {rest} x{n}" for (key, *rest), n in counter.items()]
    return "; ".join(items[:limit]) + (f" (+{len(items) - limit})" if len(items) > limit else "")
