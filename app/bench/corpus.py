"""Pages to send: seeded synthetic A4 pages (text, tables, formulas) or a folder of images.

Synthetic pages are drawn with Pillow at three sizes (100, 150, 200 dpi) and three densities,
encoded as JPEG and cached on disk, so a corpus is generated once and reused by later runs. Page
`i` is the same image on every machine (its seed is `i`); no two pages share their pixels.
`resized` gives any corpus at the model's own size, as /v1/ocr sends pages.
"""

from __future__ import annotations

import base64
import io
import os
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from PIL import Image, ImageDraw, ImageFont

from app.documents import resize
from app.documents.errors import DocumentError

Job = TypeVar("Job")  # one page's arguments, picklable for the pool
GENERATOR = "v1"  # bump when pages change: the cache folder is keyed by it
SIZES = ((827, 1169), (1240, 1754), (1654, 2339))  # A4 at 100, 150 and 200 dpi
DENSITIES = (0.75, 1.0, 1.4)  # more, smaller glyphs per line as density grows
MIME = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}
WORDS = [
    "invoice",
    "total",
    "amount",
    "date",
    "customer",
    "table",
    "revenue",
    "quarter",
    "formula",
    "chart",
    "seal",
    "signature",
    "page",
    "section",
    "paragraph",
    "figure",
    "number",
    "account",
    "balance",
    "summary",
    "report",
    "annex",
    "item",
    "price",
    "the",
    "of",
    "and",
    "to",
    "in",
    "for",
    "is",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "net",
    "gross",
    "tax",
    "due",
    "paid",
    "order",
    "unit",
    "rate",
    "period",
]
FORMULAS = (
    ("E = m · c²", None),
    ("a² + b² = c²", None),
    ("x = ", ("-b ± (b² - 4ac)^½", "2a")),
    ("f(x) = ", ("1", "1 + e^(-x)")),
    ("σ = ", ("Σ (x - μ)²", "n - 1")),  # noqa: RUF001 (Greek on purpose)
    ("P(A|B) = ", ("P(B|A) · P(A)", "P(B)")),
    ("v = ", ("d", "t")),
    ("∫ x dx = ", ("x²", "2")),
)


@dataclass(frozen=True, slots=True)
class Page:
    """One encoded image and its MIME type."""

    data: bytes
    mime: str
    name: str
    b64: bytes = b""  # base64 of `data`, encoded once: requests only splice it in

    def __post_init__(self) -> None:
        object.__setattr__(self, "b64", base64.b64encode(self.data))


class _Drawer:
    """Lays blocks of one page out top to bottom."""

    def __init__(self, rng: random.Random, size: tuple[int, int], density: float) -> None:
        self.rng = rng
        self.width, self.height = size
        self.page = Image.new("RGB", size, "white")
        self.draw = ImageDraw.Draw(self.page)
        self.size = max(10, int(self.width / (55 * density)))
        self.font = ImageFont.load_default(size=self.size)
        self.small = ImageFont.load_default(size=max(8, self.size * 2 // 3))
        self.margin = self.width // 12
        self.y = self.height // 18

    def room(self, height: int) -> bool:
        return self.y + height < self.height - self.height // 18

    def words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choices(WORDS, k=self.rng.randint(low, high)))

    def paragraph(self) -> None:
        line = int(self.size * 1.5)
        if self.rng.random() < 0.4 and self.room(line * 2):  # a heading
            heading = f"{self.rng.randint(1, 12)}. {self.words(1, 4).title()}"
            self.draw.text((self.margin, self.y), heading, fill="black", font=self.font)
            self.y += line * 2
        for _ in range(self.rng.randint(3, 9)):
            if not self.room(line):
                return
            text = self.words(6, 14)
            self.draw.text((self.margin, self.y), text, fill="black", font=self.font)
            self.y += line
        self.y += line

    def table(self) -> None:
        rows, cols = self.rng.randint(3, 9), self.rng.randint(3, 6)
        row_height = int(self.size * 1.8)
        if not self.room(rows * row_height):
            self.y = self.height  # no room left: the page is full
            return
        col_width = (self.width - 2 * self.margin) // cols
        for r in range(rows + 1):
            y = self.y + r * row_height
            self.draw.line((self.margin, y, self.margin + cols * col_width, y), fill="black")
        for c in range(cols + 1):
            x = self.margin + c * col_width
            self.draw.line((x, self.y, x, self.y + rows * row_height), fill="black")
        for r in range(rows):
            for c in range(cols):
                if r == 0:
                    cell = self.rng.choice(WORDS).title()
                else:
                    cell = f"{self.rng.uniform(0, 10_000):,.2f}" if c else self.words(1, 2)
                xy = (self.margin + c * col_width + 6, self.y + r * row_height + 4)
                self.draw.text(xy, cell[:14], fill="black", font=self.small)
        self.y += (rows + 1) * row_height

    def formula(self) -> None:
        lhs, fraction = self.rng.choice(FORMULAS)
        line = int(self.size * 1.5)
        if not self.room(line * 3):
            self.y = self.height
            return
        x = self.margin + self.rng.randint(0, self.width // 4)
        middle = self.y + line
        self.draw.text((x, middle - self.size // 2), lhs, fill="black", font=self.font)
        if fraction:
            x += int(self.draw.textlength(lhs, font=self.font)) + 4
            top, bottom = fraction
            width = int(max(self.draw.textlength(t, font=self.font) for t in fraction)) + 8
            self.draw.line((x, middle + 2, x + width, middle + 2), fill="black", width=2)
            self.draw.text((x + 4, middle - self.size - 2), top, fill="black", font=self.font)
            self.draw.text((x + 4, middle + 6), bottom, fill="black", font=self.font)
        tag = f"({self.rng.randint(1, 40)})"
        self.draw.text((self.width - self.margin, middle - self.size // 2), tag, "black", self.font)
        self.y += line * 3


def synthetic_page(seed: int) -> bytes:
    """Page `seed`: a JPEG of headed paragraphs, ruled tables and formulas at a seeded size."""
    rng = random.Random(seed)  # noqa: S311 (seeded for reproducible pages, not secrets)
    drawer = _Drawer(rng, rng.choice(SIZES), rng.choice(DENSITIES))
    blocks = (drawer.paragraph, drawer.table, drawer.formula)
    while drawer.room(drawer.size * 2):
        rng.choices(blocks, weights=(5, 3, 2))[0]()
    # a serial in the footer: even two pages drawn alike never share their pixels
    footer = (drawer.margin, drawer.height - drawer.height // 30)
    drawer.draw.text(footer, f"page {seed}", fill="black", font=drawer.small)
    out = io.BytesIO()
    drawer.page.save(out, format="JPEG", quality=rng.choice((75, 85, 92)))
    return out.getvalue()


def _cached(args: tuple[Path, int]) -> bytes:
    folder, seed = args
    path = folder / f"page-{seed:06d}.jpg"
    if path.exists():
        return path.read_bytes()
    data = synthetic_page(seed)
    _keep(path, data)
    return data


def _keep(path: Path, data: bytes) -> None:
    """`data` written to `path` atomically: a concurrent run never reads half a page."""
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_bytes(data)
    temporary.replace(path)


def _made(function: Callable[[Job], bytes], jobs: list[Job], missing: int,
          workers: int | None) -> list[bytes]:  # fmt: skip
    """`function` over `jobs`, over every core when more than 8 pages are still to be made."""
    if missing > 8:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
            return list(pool.map(function, jobs, chunksize=8))
    return [function(job) for job in jobs]


def default_cache() -> Path:
    """Where synthetic pages are kept between runs (XDG_CACHE_HOME or ~/.cache)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ocrvl" / "bench-pages"


def synthetic(count: int, cache: Path | None = None, workers: int | None = None) -> list[Page]:
    """Pages 0 .. count-1, generated over every core on first use and cached in `cache`."""
    folder = (cache or default_cache()) / GENERATOR
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(folder, seed) for seed in range(count)]
    missing = sum(not (folder / f"page-{s:06d}.jpg").exists() for s in range(count))
    datas = _made(_cached, jobs, missing, workers)
    return [Page(data, "image/jpeg", f"synthetic-{s}") for s, data in enumerate(datas)]


def _resized(args: tuple[Path | None, str, bytes, int, int]) -> bytes:
    folder, name, data, min_pixels, max_pixels = args
    path = folder / f"{name}.jpg" if folder else None
    if path and path.exists():
        return path.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as image:
            encoded = resize.encode(resize.for_model(image, min_pixels, max_pixels))
    except DocumentError as exc:
        raise ValueError(f"page {name}: {exc.message}") from None
    if path:
        _keep(path, encoded)
    return encoded


def resized(
    pages: list[Page],
    min_pixels: int,
    max_pixels: int,
    cache: Path | None = None,
    workers: int | None = None,
) -> list[Page]:
    """`pages` as /v1/ocr sends them: upright RGB at the size PaddleOCR-VL's processor would
    resize them to within these bounds (app/documents/resize.py), JPEG at quality 95, so the
    engine's own resize changes nothing. With `cache` (for pages whose names say what they
    hold, as synthetic pages' do), each is made once and kept there."""
    folder = None
    if cache is not None:
        folder = cache / f"{GENERATOR}-resized-{min_pixels}-{max_pixels}"
        folder.mkdir(parents=True, exist_ok=True)
    jobs = [(folder, page.name, page.data, min_pixels, max_pixels) for page in pages]
    missing = sum(not (folder and (folder / f"{page.name}.jpg").exists()) for page in pages)
    datas = _made(_resized, jobs, missing, workers)
    return [Page(data, "image/jpeg", page.name) for page, data in zip(pages, datas, strict=True)]


def from_folder(folder: Path) -> list[Page]:
    """Every image in `folder` (JPEG, PNG, WebP), sorted by name."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in MIME and p.is_file())
    if not files:
        raise ValueError(f"{folder} holds no .jpg, .jpeg, .png or .webp page images")
    return [Page(p.read_bytes(), MIME[p.suffix.lower()], p.name) for p in files]


def draws(pages: list[Page], seed: int) -> Iterator[Page]:
    """The pages in a seeded order, each at most once: a level never sends an image twice."""
    order = list(range(len(pages)))
    random.Random(seed).shuffle(order)  # noqa: S311 (a reproducible order)
    return (pages[i] for i in order)
