"""Method 2's corpus: varied pages drawn at run time, their boxes, their output lengths.

    python -m bench.gpu.corpus work --pages 60 --out work.json   # each page's requests, the floor's
    python -m bench.gpu.corpus page --number 3 --out page.jpg

Page `n` is kind `n % 7` of KINDS (README.md, "Method 2": seven kinds, 2 to 10 blocks each),
drawn with its words, tables and formulas seeded by `n`, nothing committed; its output length
from `Lengths` (a random-weight model never stops early: `max_tokens` is the answer's length).
`boxes` answers a page's blocks from its aspect ratio alone (what `bench.gpu.layout_standin`
serves); `work` lists what `/v1/ocr` sends for each page, whole and by blocks (as
app/documents/crops.py cuts them): what `bench.gpu.floor --work` times.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from app.bench.corpus import FORMULAS, WORDS

Frac = tuple[float, float, float, float]
CLASS = {"doc_title": 6, "paragraph_title": 17, "text": 22, "table": 21, "display_formula": 15}
SCORE = 0.92
REPORT = (("doc_title", (0.12, 0.045, 0.88, 0.085)), ("text", (0.10, 0.11, 0.90, 0.25)),
          ("paragraph_title", (0.10, 0.27, 0.55, 0.295)), ("text", (0.10, 0.31, 0.90, 0.43)),
          ("table", (0.10, 0.45, 0.90, 0.68)), ("display_formula", (0.22, 0.70, 0.78, 0.76)),
          ("text", (0.10, 0.78, 0.90, 0.93)))  # fmt: skip
LEGAL = (("doc_title", (0.1, 0.04, 0.9, 0.07)), ("text", (0.08, 0.09, 0.92, 0.17)),
         ("paragraph_title", (0.08, 0.19, 0.45, 0.21)), ("text", (0.08, 0.22, 0.48, 0.50)),
         ("text", (0.52, 0.22, 0.92, 0.50)), ("table", (0.08, 0.53, 0.92, 0.70)),
         ("display_formula", (0.25, 0.72, 0.75, 0.76)),
         ("paragraph_title", (0.08, 0.78, 0.45, 0.80)),
         ("text", (0.08, 0.81, 0.48, 0.95)), ("text", (0.52, 0.81, 0.92, 0.95)))  # fmt: skip
# kind: (sizes it is drawn at, its blocks in reading order); aspect ratios all >= 8 % apart
KINDS: dict[str, tuple[tuple[tuple[int, int], ...], tuple[tuple[str, Frac], ...]]] = {
    "report": (((1240, 1754), (1654, 2339)), REPORT),
    "memo": (((1275, 1650),), (("doc_title", (0.1, 0.05, 0.9, 0.09)),
                               ("text", (0.1, 0.12, 0.9, 0.45)), ("text", (0.1, 0.5, 0.9, 0.8)))),
    "slide": (((1600, 900), (1280, 720)), (("doc_title", (0.06, 0.06, 0.94, 0.18)),
                                           ("text", (0.06, 0.25, 0.48, 0.9)),
                                           ("table", (0.52, 0.25, 0.94, 0.8)))),
    "receipt": (((600, 1500),), (("doc_title", (0.1, 0.02, 0.9, 0.06)),
                                 ("table", (0.06, 0.22, 0.94, 0.8)))),
    "legal": (((1275, 2100),), LEGAL),
    "card": (((700, 440),), (("doc_title", (0.08, 0.1, 0.92, 0.3)),
                             ("text", (0.08, 0.4, 0.92, 0.9)))),
    "form": (((1000, 1000),), (("doc_title", (0.1, 0.05, 0.9, 0.12)),
                               ("table", (0.1, 0.15, 0.9, 0.55)),
                               ("display_formula", (0.2, 0.6, 0.8, 0.68)),
                               ("text", (0.1, 0.72, 0.9, 0.82)), ("text", (0.1, 0.85, 0.9, 0.95)))),
}  # fmt: skip
NAMES = tuple(KINDS)
Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


@dataclass(frozen=True)
class Lengths:
    """Output tokens per page: log-normal around `median`, clipped to [low, high]."""

    median: int = 400
    sigma: float = 0.6
    low: int = 32
    high: int = 2000

    def of(self, number: int) -> int:
        """Page `number`'s length (seeded by it)."""
        drawn = random.Random(f"length-{number}").lognormvariate(math.log(self.median), self.sigma)  # noqa: S311
        return max(self.low, min(self.high, round(drawn)))


def kind_of(number: int) -> tuple[str, tuple[int, int]]:
    """Page `number`'s kind and size."""
    name = NAMES[number % len(NAMES)]
    sizes = KINDS[name][0]
    return name, sizes[(number // len(NAMES)) % len(sizes)]


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def _table(pen: ImageDraw.ImageDraw, rng: random.Random, box: tuple[int, ...], font: Font) -> None:
    """A ruled table: a header of words, then words and numbers; 4-9 rows, 3-5 columns."""
    x1, y1, x2, y2 = box
    rows, cols = rng.randint(4, 9), rng.randint(3, 5)
    row_h, col_w = (y2 - y1) // rows, (x2 - x1) // cols
    for r in range(rows + 1):
        pen.line((x1, y1 + r * row_h, x1 + cols * col_w, y1 + r * row_h), fill="black")
    for c in range(cols + 1):
        pen.line((x1 + c * col_w, y1, x1 + c * col_w, y1 + rows * row_h), fill="black")
    for r in range(rows):
        for c in range(cols):
            cell = rng.choice(WORDS).title() if r == 0 else (
                f"{rng.uniform(0, 10_000):,.2f}" if c else _words(rng, 1, 2))  # fmt: skip
            pen.text((x1 + c * col_w + 6, y1 + r * row_h + 6), cell[:14], "black", font)


def _formula(
    pen: ImageDraw.ImageDraw, rng: random.Random, box: tuple[int, ...], font: Font
) -> None:
    """A display formula with a fraction, around the middle of its box."""
    x1, y1, x2, y2 = box
    lhs, fraction = rng.choice([f for f in FORMULAS if f[1]])
    top, bottom = fraction or ("", "")
    middle, x = (y1 + y2) // 2, x1 + (x2 - x1) // 4
    size = int(getattr(font, "size", 12))
    pen.text((x, middle - size // 2), lhs, fill="black", font=font)
    x += int(pen.textlength(lhs, font=font)) + 4
    span = int(max(pen.textlength(top, font=font), pen.textlength(bottom, font=font))) + 8
    pen.line((x, middle + 2, x + span, middle + 2), fill="black", width=2)
    pen.text((x + 4, middle - size - 2), top, fill="black", font=font)
    pen.text((x + 4, middle + 6), bottom, fill="black", font=font)


def draw(number: int) -> bytes:
    """Page `number` as a JPEG: its kind's blocks drawn inside their boxes, seeded by `number`."""
    rng = random.Random(number)  # noqa: S311 (seeded pages, not secrets)
    name, (width, height) = kind_of(number)
    page = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(page)
    px = max(10, min(width, height) // 45)
    body, big = ImageFont.load_default(size=px), ImageFont.load_default(size=int(px * 1.8))
    small = ImageFont.load_default(size=max(8, int(px * 0.7)))
    for label, (fx1, fy1, fx2, fy2) in KINDS[name][1]:
        box = (int(fx1 * width), int(fy1 * height), int(fx2 * width), int(fy2 * height))
        x1, y1, x2, y2 = box
        if label.endswith("title"):
            font = big if label == "doc_title" else body
            title = _words(rng, 2, 5).title()
            pen.text((x1 + 4, y1 + 4), title[: int((x2 - x1) / (px * 0.6))], "black", font)
        elif label == "text":
            line, y, per_line = int(px * 1.5), y1 + 2, int((x2 - x1) / (px * 0.55))
            while y + line <= y2:
                pen.text((x1 + 2, y), _words(rng, 10, 18)[:per_line], fill="black", font=body)
                y += line
        elif label == "table":
            _table(pen, rng, box, small)
        else:
            _formula(pen, rng, box, body)
    out = io.BytesIO()
    page.save(out, format="JPEG", quality=85)
    return out.getvalue()


def boxes(width: int, height: int) -> list[dict[str, Any]]:
    """The layout service's answer for a page of `width` x `height`: the blocks of the kind whose
    aspect ratio is nearest, in its pixels."""
    name = min(NAMES, key=lambda n: abs(math.log(height / width * KINDS[n][0][0][0]
                                                 / KINDS[n][0][0][1])))  # fmt: skip
    return [
        {"cls_id": CLASS[label], "label": label, "score": SCORE, "order": order,
         "coordinate": [round(fx1 * width, 1), round(fy1 * height, 1),
                        round(fx2 * width, 1), round(fy2 * height, 1)]}
        for order, (label, (fx1, fy1, fx2, fy2)) in enumerate(KINDS[name][1], start=1)
    ]  # fmt: skip


def block_tokens(number: int) -> list[int]:
    """The visual tokens of each block `/v1/ocr` sends for page `number` with a layout (the
    gateway's own pipeline and default pixel bounds)."""
    from app.documents import crops, raster, sniff  # noqa: PLC0415 (the gateway's, on demand)
    from app.documents.blocks import Box  # noqa: PLC0415
    from app.documents.layout_options import LayoutOptions  # noqa: PLC0415

    data = draw(number)
    with tempfile.NamedTemporaryFile(suffix=".jpg") as file:
        file.write(data)
        file.flush()
        source = raster.Source(file.name, sniff.sniff(data[:64]), 144, *_bounds())
        with Image.open(io.BytesIO(data)) as image:
            given = [Box(b["cls_id"], b["label"], b["score"], tuple(b["coordinate"]), b["order"])
                     for b in boxes(image.width, image.height)]  # fmt: skip
        planned = crops.prepare(source, 0, given, LayoutOptions())
    return [b.tokens for b in planned.blocks if b.prompt is not None]


def _bounds() -> tuple[int, int, int]:
    """The gateway's default min_pixels, max_pixels and max_page_pixels (no settings read)."""
    from app.settings import Settings  # noqa: PLC0415

    fields = Settings.model_fields
    return tuple(fields[n].default for n in ("ocr_min_pixels", "max_pixels", "max_page_pixels"))  # type: ignore[return-value]


def page_tokens(number: int) -> int:
    """The visual tokens of page `number` read whole (the model's resize, the gateway's bounds)."""
    from app.documents.resize import smart_resize  # noqa: PLC0415

    width, height = kind_of(number)[1]
    low, high, _ = _bounds()
    h, w = smart_resize(height, width, low, high)
    return (h // 28) * (w // 28)


def split(total: int, blocks: int) -> int:
    """A block's `max_tokens` when a page of `total` output tokens is read in `blocks` blocks."""
    return max(1, math.ceil(total / max(1, blocks)))


def work(pages: int, lengths: Lengths) -> dict[str, list[list[list[int]]]]:
    """Per page, its requests as [visual tokens, output tokens]: `whole` one per page, `blocks`
    one per block sent (each block its share of the page's length)."""
    whole, blocks = [], []
    for number in range(pages):
        total, sent = lengths.of(number), block_tokens(number)
        whole.append([[page_tokens(number), total]])
        blocks.append([[tokens, split(total, len(sent))] for tokens in sent])
    return {"whole": whole, "blocks": blocks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.corpus")
    parser.add_argument("what", choices=("work", "page"))
    parser.add_argument("--pages", type=int, default=60, help="work: the corpus's first pages")
    parser.add_argument("--median", type=int, default=Lengths.median)
    parser.add_argument("--sigma", type=float, default=Lengths.sigma)
    parser.add_argument("--number", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.what == "work":
        made = work(args.pages, Lengths(args.median, args.sigma))
        args.out.write_text(json.dumps(made) + "\n")
    else:
        args.out.write_bytes(draw(args.number))
    return 0


if __name__ == "__main__":
    sys.exit(main())
