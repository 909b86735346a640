"""The fidelity tier's synthetic pages, each with its layout boxes, drawn at test time.

Every page has a size of its own: the layout stand-ins (the gateway's and PaddleX's) find a
page's boxes by its "WxH". Each builder's docstring says which of PaddleX's rules it exercises
(`paddlex/inference/pipelines/paddleocr_vl/`: `filter_overlap_boxes`, `merge_blocks`,
`crop_margin` in uilts.py; prompts and assembly in pipeline.py; markdown in result.py and
`common/result/converter/markdown_format_funcs.py`); test_paddlex_fidelity.py checks that
PaddleX's own output shows each rule at work, so the corpus cannot quietly stop covering one.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from tests.fidelity.sketch import Page, Sketch

ORIENTATION = 0x0112  # the EXIF tag


def article() -> Page:
    """A page of prose: header, titles, paragraphs, footnote, footer and page number."""
    s = Sketch("article", 1000, 1400, seed=1)
    s.text("header", (80, 30, 600, 60), lines=1, size=14)
    s.text("doc_title", (150, 90, 850, 150), lines=1, size=34)
    s.text("text", (80, 180, 920, 330))
    s.text("paragraph_title", (80, 360, 500, 395), lines=1, size=24)
    s.text("text", (80, 410, 920, 600))
    s.text("paragraph_title", (80, 630, 500, 665), lines=1, size=24)
    s.text("text", (80, 680, 920, 900))
    s.text("footnote", (80, 1250, 920, 1290), lines=1, size=12)
    s.text("footer", (80, 1330, 600, 1360), lines=1, size=12)
    s.text("number", (880, 1330, 920, 1360), lines=1, size=14)
    return s.page()


def merged_paragraphs() -> Page:
    """Text blocks PaddleX merges into one request (side by side; beside a figure), and a
    side-by-side group too tall to merge (aspect >= 3)."""
    s = Sketch("merged_paragraphs", 1010, 1400, seed=2)
    s.text("paragraph_title", (80, 80, 500, 115), lines=1, size=24)
    s.text("text", (80, 150, 340, 190), lines=1)  # one line split in three: `is_cross`
    s.text("text", (360, 150, 620, 190), lines=1)
    s.text("text", (640, 150, 900, 190), lines=1)
    s.text("text", (80, 240, 540, 520))  # wraps round the figure: `is_updown_align`
    s.picture("image", (560, 240, 920, 520))
    s.text("text", (80, 530, 900, 620))
    s.text("figure_title", (560, 630, 920, 660), lines=1, size=14)
    s.text("text", (100, 700, 300, 1300))  # two narrow columns: too tall to merge
    s.text("text", (320, 700, 520, 1300))
    s.text("text", (560, 700, 940, 760), lines=2)
    return s.page()


def tables() -> Page:
    """Tables with captions, a text box nested in a table (dropped), a table beside text."""
    s = Sketch("tables", 1020, 1400, seed=18)
    s.text("text", (80, 60, 940, 160))
    s.text("figure_title", (80, 180, 600, 210), lines=1, size=16)
    s.table((80, 220, 940, 520), rows=5, columns=4)
    s.text("text", (300, 300, 500, 340), lines=1)  # inside the table: PaddleX drops it
    s.text("text", (80, 560, 940, 660))
    s.table((80, 700, 500, 900), rows=3, columns=2)
    s.text("text", (540, 700, 940, 900))
    s.text("figure_title", (80, 910, 500, 940), lines=1, size=16)
    return s.page()


def formulas() -> Page:
    """Display formulas with and without numbers, inline formulas, margins trimmed."""
    s = Sketch("formulas", 1030, 1400, seed=4)
    s.text("text", (80, 60, 940, 180))
    s.formula("display_formula", (250, 200, 780, 280))
    s.text("formula_number", (880, 220, 940, 260), lines=1, size=20)
    s.text("text", (80, 300, 940, 400))
    s.formula("display_formula", (300, 420, 730, 500))
    s.text("text", (80, 520, 940, 640))
    s.formula("inline_formula", (300, 528, 380, 556))  # inside the text: dropped
    s.formula("inline_formula", (400, 680, 520, 720))  # on its own: recognised
    s.box("display_formula", (300, 760, 730, 840))  # nothing drawn: margins stay
    s.draw.line((400, 800, 600, 800), fill="black", width=2)
    s.box("display_formula", (300, 860, 730, 940))  # a bare rule: trimmed to 2 px, kept whole
    s.formula("display_formula", (250, 980, 780, 1060), size=30)
    s.text("formula_number", (880, 1000, 940, 1040), lines=1, size=20)
    return s.page()


def figures() -> Page:
    """Images with captions, a chart, a seal, header and footer images, a vision footnote."""
    s = Sketch("figures", 1040, 1400, seed=5)
    s.picture("header_image", (80, 20, 200, 70))
    s.text("header", (600, 30, 960, 60), lines=1, size=14)
    s.picture("image", (100, 100, 600, 450))
    s.text("figure_title", (100, 460, 600, 500), lines=1, size=16)
    s.chart((640, 100, 960, 400))
    s.text("figure_title", (640, 410, 960, 440), lines=1, size=16)
    s.text("text", (80, 540, 960, 700))
    s.seal((700, 760, 900, 960))
    s.text("text", (80, 760, 660, 960))
    s.text("vision_footnote", (100, 980, 600, 1010), lines=1, size=12)
    s.picture("footer_image", (80, 1320, 200, 1370))
    return s.page()


def overlaps() -> Page:
    """Boxes PaddleX's overlap filter drops or keeps, a reference box, tiny boxes."""
    s = Sketch("overlaps", 1050, 1400, seed=6)
    s.text("text", (80, 60, 940, 200))
    s.box("text", (90, 70, 900, 190))  # mostly inside the one before: the smaller goes
    s.text("paragraph_title", (80, 230, 500, 265), lines=1, size=24)
    s.box("text", (80, 230, 500, 265))  # the same area: the later one goes
    s.text("text", (80, 300, 500, 400))
    s.text("text", (350, 300, 940, 400))  # half overlapping: both stay
    s.picture("image", (80, 440, 500, 700))
    s.chart((100, 460, 480, 690))  # image and chart overlap: both stay
    s.text("text", (150, 520, 400, 560), lines=1)  # text inside an image: both stay
    s.text("reference", (540, 440, 940, 560))  # `reference` boxes are never used
    s.text("reference_content", (540, 580, 940, 700))
    s.box("text", (540, 720, 545, 760))  # 5 px wide: dropped
    s.box("text", (560, 720, 590, 725))  # 5 px high: dropped
    s.formula("inline_formula", (700, 720, 800, 760))  # two inline formulas overlapping:
    s.formula("inline_formula", (720, 725, 810, 765))  # both dropped
    s.draw.rectangle((600, 720, 606, 726), fill="black")
    s.box("text", (600, 720, 606, 726))  # 6 px: kept, sent as it is
    s.text("text", (80, 800, 940, 1000))
    return s.page()


def polygons() -> Page:
    """A slanted and an L-shaped region: crops masked to the polygon, polygon overlaps."""
    s = Sketch("polygons", 1060, 1400, seed=7)
    s.text("text", (80, 60, 940, 200))
    pentagon = [[80, 240], [940, 240], [940, 380], [500, 500], [80, 500]]
    s.text("text", (80, 240, 940, 500), polygon=pentagon)
    s.text("text", (80, 560, 700, 800), polygon=[[120, 560], [700, 560], [660, 800], [80, 800]])
    s.picture("image", (560, 620, 940, 900))
    # one box inside the other, their polygons (two triangles) apart: both stay
    s.text("text", (80, 940, 700, 1180), polygon=[[80, 940], [700, 940], [80, 1180]])
    s.text("text", (100, 950, 690, 1170), polygon=[[690, 950], [690, 1170], [100, 1170]])
    return s.page()


def other_labels() -> Page:
    """The remaining labels, each with its own markdown rule."""
    s = Sketch("other_labels", 1070, 1400, seed=8)
    s.text("doc_title", (150, 60, 850, 110), lines=1, size=30)
    s.text("abstract", (80, 140, 940, 260))
    s.text("content", (80, 290, 500, 420))
    s.text("algorithm", (540, 290, 940, 420))
    s.text("aside_text", (10, 450, 60, 900), size=12)
    s.text("vertical_text", (900, 450, 960, 900), size=12)
    s.text("reference_content", (80, 450, 860, 560))
    s.text("text", (80, 600, 860, 760))
    return s.page()


def table_figure() -> Page:
    """A figure inside a table: PaddleX paints `[F<n>]` over it in the table's crop (with
    OpenCV's Hershey font, which the gateway draws with Pillow's: a known difference) and
    drops it from the page's blocks."""
    s = Sketch("table_figure", 1080, 1400, seed=9)
    s.text("text", (80, 60, 940, 160))
    s.table((80, 200, 940, 600), rows=4, columns=3)
    s.picture("image", (660, 320, 900, 480))  # wholly inside the table: tokenized
    s.text("figure_title", (80, 610, 600, 640), lines=1, size=16)
    s.picture("image", (300, 700, 700, 1000))  # outside: an image block as usual
    return s.page()


def thin_formula() -> Page:
    """A formula whose ink is 3 px high: PaddleX sends the 3-px crop its margins trim to (the
    crop PaddleOCR#17378 says vLLM answers 500 to); the gateway pads it to 4 px (issue 36's
    guard: a known, deliberate difference)."""
    s = Sketch("thin_formula", 1090, 1400, seed=10)
    s.text("text", (80, 60, 940, 160))
    s.draw.rectangle((400, 240, 600, 242), fill="black")
    s.box("display_formula", (300, 200, 730, 280))
    s.text("text", (80, 320, 940, 420))
    return s.page()


BUILDERS: tuple[Callable[[], Page], ...] = (
    article, merged_paragraphs, tables, formulas, figures, overlaps, polygons, other_labels,
    table_figure, thin_formula,
)  # fmt: skip
# Documents where the gateway deliberately or unavoidably differs from PaddleX, each in a run of
# its own (tests/fidelity/conftest.py RUNS; test_paddlex_fidelity.py pins each difference).
KNOWN_DIFFERENCES = ("table_figure", "thin_formula", "polygons-alpha")
# The input files: every page as a PNG; pages as a JPEG (both sides decode it alike), a JPEG
# stored on its side with EXIF orientation 6 (both turn it upright), a grey PNG, a 16-bit grey
# PNG, a PNG with an
# alpha channel (a known difference: PaddleX's OpenCV reader drops the alpha and reads the
# colours under it, black here; the gateway lays the page on white); a one-page and a
# three-page PDF (both render at 144 dpi with pdfium: PaddleX's scale 2, /v1/ocr's default
# dpi); a two-page TIFF.
DOCUMENTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    *((build.__name__, "png", (build.__name__,)) for build in BUILDERS),
    ("figures-photo", "jpeg", ("figures",)),
    ("figures-sideways", "jpeg-exif", ("figures",)),
    ("article-grey", "png-grey", ("article",)),
    ("figures-16bit", "png-16", ("figures",)),
    ("polygons-alpha", "png-alpha", ("polygons",)),
    ("formulas-pdf", "pdf", ("formulas",)),
    ("book-pdf", "pdf", ("article", "merged_paragraphs", "tables")),
    ("book-tiff", "tiff", ("polygons", "other_labels")),
)
EXTENSIONS = {"jpeg-exif": "jpeg", "png-grey": "png", "png-16": "png", "png-alpha": "png"}


@dataclass(frozen=True)
class Document:
    """One input file and the pages in it, in order."""

    name: str
    path: Path
    pages: list[Page]


def write(folder: Path) -> list[Document]:
    """Draw every page and write DOCUMENTS into `folder`."""
    pages = {build.__name__: build() for build in BUILDERS}
    documents = []
    for name, kind, members in DOCUMENTS:
        chosen = [pages[member] for member in members]
        path = folder / f"{name}.{EXTENSIONS.get(kind, kind)}"
        path.write_bytes(encode([page.image for page in chosen], kind))
        documents.append(Document(name, path, chosen))
    return documents


def encode(images: list[Image.Image], kind: str) -> bytes:
    """`images` as one file of `kind` (DOCUMENTS' second column)."""
    out = io.BytesIO()
    # copies: Pillow keeps an encoder's settings on the image it saved (PNG's would break
    # the TIFF writer's raw encoder)
    first, *rest = (image.copy() for image in images)
    if kind == "pdf":  # 144 dpi: rendered at 144 dpi, each page comes back at its pixel size
        first.save(out, format="PDF", save_all=True, append_images=rest, resolution=144.0)
    elif kind == "tiff":
        first.save(out, format="TIFF", save_all=True, append_images=rest)
    elif kind == "jpeg":
        first.save(out, format="JPEG", quality=85)
    elif kind == "jpeg-exif":  # stored turned left; orientation 6: turn right to show
        exif = Image.Exif()
        exif[ORIENTATION] = 6
        first.transpose(Image.Transpose.ROTATE_90).save(out, format="JPEG", quality=85, exif=exif)
    elif kind == "png-grey":
        first.convert("L").save(out, format="PNG")
    elif kind == "png-16":  # 16 bits of grey (v * 257): both sides read its high byte
        first.convert("L").convert("I").point(lambda v: v * 257).convert("I;16").save(out, "PNG")
    elif kind == "png-alpha":  # ink opaque, paper transparent black, as some exporters write
        alpha = first.convert("L").point(lambda v: 255 - v if v < 250 else 0)
        clear = Image.new("RGB", first.size, "black")
        layered = Image.composite(first, clear, alpha)
        layered.putalpha(alpha)
        layered.save(out, format="PNG")
    else:
        first.save(out, format="PNG")
    return out.getvalue()
