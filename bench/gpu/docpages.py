"""The document path's corpus: A4 pages with realistic blocks at fixed places, and their boxes.

    python -m bench.gpu.docpages mix [--pages 20]       # the blocks' visual tokens, for the floor
    python -m bench.gpu.docpages describe               # every block as the gateway plans it

Random layout weights give random boxes, so the pipeline is driven by fixed ones: every page is
drawn with the same seven blocks in the same places (a document title, two text paragraphs, a
section title, a third paragraph, a ruled table, a display formula), its words, numbers and
formula seeded by the page's number (no two pages share their pixels), and `boxes` answers those
blocks for any page, scaled to the size it was sent at, as the layout service's API gives them
(`bench.gpu.layout_standin` serves them). `plan` runs the gateway's own pipeline
(app/documents/crops.py: overlap rules, merging of adjacent text, crops, the model's resize) on
a page with those boxes, so the blocks sent and their visual tokens are the ones `/v1/ocr` sends;
`mix` is what `bench.gpu.floor --mix` takes for the same visual tokens.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from app.bench.corpus import FORMULAS, WORDS, Page

SIZE = (1240, 1754)  # A4 at 150 dpi
# (label, PP-DocLayoutV3 class id, (x1, y1, x2, y2) as fractions of the page), reading order
BLOCKS: tuple[tuple[str, int, tuple[float, float, float, float]], ...] = (
    ("doc_title", 6, (0.12, 0.045, 0.88, 0.085)),
    ("text", 22, (0.10, 0.11, 0.90, 0.25)),
    ("paragraph_title", 17, (0.10, 0.27, 0.55, 0.295)),
    ("text", 22, (0.10, 0.31, 0.90, 0.43)),
    ("table", 21, (0.10, 0.45, 0.90, 0.68)),
    ("display_formula", 15, (0.22, 0.70, 0.78, 0.76)),
    ("text", 22, (0.10, 0.78, 0.90, 0.93)),
)
SCORE = 0.92


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


def _table(pen: ImageDraw.ImageDraw, rng: random.Random, box: tuple[int, int, int, int],
           font: Font) -> None:  # fmt: skip
    """A ruled table of 8 rows and 5 columns: a header of words, then words and numbers."""
    x1, y1, x2, y2 = box
    rows, cols = 8, 5
    row_h, col_w = (y2 - y1) // rows, (x2 - x1) // cols
    for r in range(rows + 1):
        pen.line((x1, y1 + r * row_h, x1 + cols * col_w, y1 + r * row_h), fill="black")
    for c in range(cols + 1):
        pen.line((x1 + c * col_w, y1, x1 + c * col_w, y1 + rows * row_h), fill="black")
    for r in range(rows):
        for c in range(cols):
            if r == 0:
                cell = rng.choice(WORDS).title()
            else:
                cell = f"{rng.uniform(0, 10_000):,.2f}" if c else _words(rng, 1, 2)
            pen.text((x1 + c * col_w + 6, y1 + r * row_h + 6), cell[:14], "black", font)


def _formula(pen: ImageDraw.ImageDraw, rng: random.Random, box: tuple[int, int, int, int],
             font: Font) -> None:  # fmt: skip
    """A display formula with a fraction, around the middle of its box."""
    x1, y1, x2, y2 = box
    lhs, fraction = rng.choice([f for f in FORMULAS if f[1]])
    assert fraction is not None  # noqa: S101 (filtered above)
    middle, x = (y1 + y2) // 2, x1 + (x2 - x1) // 4
    size = int(getattr(font, "size", 12))
    pen.text((x, middle - size // 2), lhs, fill="black", font=font)
    x += int(pen.textlength(lhs, font=font)) + 4
    span = int(max(pen.textlength(t, font=font) for t in fraction)) + 8
    pen.line((x, middle + 2, x + span, middle + 2), fill="black", width=2)
    pen.text((x + 4, middle - size - 2), fraction[0], fill="black", font=font)
    pen.text((x + 4, middle + 6), fraction[1], fill="black", font=font)


def draw(number: int, size: tuple[int, int] = SIZE) -> bytes:
    """Page `number` as a JPEG: each block of BLOCKS drawn inside its box, seeded by `number`."""
    rng = random.Random(number)  # noqa: S311 (seeded pages, not secrets)
    width, height = size
    page = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(page)
    px = max(10, width // 55)
    body = ImageFont.load_default(size=px)
    big_size = max(14, width // 28)
    big = ImageFont.load_default(size=big_size)
    small = ImageFont.load_default(size=max(8, width // 80))
    for label, _, (fx1, fy1, fx2, fy2) in BLOCKS:
        x1, y1, x2, y2 = int(fx1 * width), int(fy1 * height), int(fx2 * width), int(fy2 * height)
        if label in ("doc_title", "paragraph_title"):
            font, font_size = (big, big_size) if label == "doc_title" else (body, px)
            title = _words(rng, 2, 5).title()
            if label == "paragraph_title":
                title = f"{rng.randint(1, 9)}. {title}"
            pen.text((x1 + 4, y1 + 4), title[: int((x2 - x1) / (font_size * 0.55))], "black", font)
        elif label == "text":
            line, y = int(px * 1.5), y1 + 2
            per_line = int((x2 - x1) / (px * 0.55))
            while y + line <= y2:
                pen.text((x1 + 2, y), _words(rng, 10, 18)[:per_line], fill="black", font=body)
                y += line
        elif label == "table":
            _table(pen, rng, (x1, y1, x2, y2), small)
        else:  # the display formula: a fraction around the middle of its box
            _formula(pen, rng, (x1, y1, x2, y2), body)
    pen.text((width // 2, int(height * 0.965)), f"page {number}", fill="black", font=small)
    out = io.BytesIO()
    page.save(out, format="JPEG", quality=85)
    return out.getvalue()


def corpus(count: int) -> list[Page]:
    """Pages 0 .. count-1 (about 20 ms each to draw; no cache: they are made in the load)."""
    return [Page(draw(n), "image/jpeg", f"doc-{n}") for n in range(count)]


def boxes(width: int, height: int) -> list[dict[str, Any]]:
    """The layout service's answer for a page of `width` x `height`: BLOCKS, in its pixels."""
    return [
        {"cls_id": cls_id, "label": label, "score": SCORE, "order": order,
         "coordinate": [round(fx1 * width, 1), round(fy1 * height, 1),
                        round(fx2 * width, 1), round(fy2 * height, 1)]}
        for order, (label, cls_id, (fx1, fy1, fx2, fy2)) in enumerate(BLOCKS, start=1)
    ]  # fmt: skip


def plan(number: int = 0) -> list[dict[str, Any]]:
    """Page `number`'s blocks as the gateway's pipeline plans them (app/documents/crops.py), with
    the gateway's default pixel bounds: label, prompt (None: not sent) and visual tokens."""
    from app.documents import crops, raster, sniff  # noqa: PLC0415 (the gateway's, on demand)
    from app.documents.blocks import Box  # noqa: PLC0415
    from app.documents.layout_options import LayoutOptions  # noqa: PLC0415
    from app.settings import Settings  # noqa: PLC0415

    data = draw(number)
    with tempfile.NamedTemporaryFile(suffix=".jpg") as file:
        file.write(data)
        file.flush()
        fields = Settings.model_fields  # the gateway's defaults (no settings are read)
        source = raster.Source(
            file.name, sniff.sniff(data[:64]), 144, fields["ocr_min_pixels"].default,
            fields["max_pixels"].default, fields["max_page_pixels"].default,
        )  # fmt: skip
        given = [Box(b["cls_id"], b["label"], b["score"], tuple(b["coordinate"]), b["order"])
                 for b in boxes(*SIZE)]  # fmt: skip
        planned = crops.prepare(source, 0, given, LayoutOptions())
    return [{"label": b.label, "prompt": b.prompt, "tokens": b.tokens, "bbox": b.bbox}
            for b in planned.blocks]  # fmt: skip


def mix(pages: int = 20) -> list[int]:
    """The visual tokens of each block `/v1/ocr` sends for a page of this corpus, averaged over
    its first `pages` pages (the formula's crop is trimmed of its white margins, so its size
    follows the formula drawn: 150-160 tokens; every other block's is the same on each page)."""
    sent = [[b["tokens"] for b in plan(n) if b["prompt"] is not None] for n in range(pages)]
    return [round(sum(column) / len(column)) for column in zip(*sent, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.docpages")
    parser.add_argument("what", choices=("mix", "describe", "page"))
    parser.add_argument("--number", type=int, default=0)
    parser.add_argument("--pages", type=int, default=20, help="mix: averaged over these")
    parser.add_argument("--out", type=Path, default=Path("doc-page.jpg"))
    args = parser.parse_args(argv)
    if args.what == "mix":
        print(",".join(str(t) for t in mix(args.pages)))
    elif args.what == "describe":
        for block in plan(args.number):
            print(block)
    else:
        args.out.write_bytes(draw(args.number))
    return 0


if __name__ == "__main__":
    sys.exit(main())
