"""Preprocessing throughput: rasterise + resize + encode of a 50-page PDF at 1, 2 and N workers.

    python -m bench.preprocess [--pages 50] [--workers 1,2,N] [--repeats 3] [--tag T] [--out DIR]

Runs the gateway's own `Preprocessor` (app/documents/workers.py: the process pool the lifespan
owns) on an A4 text PDF made here, all pages submitted at once, as /v1/ocr does with a large
OCRVL_OCR_PAGE_CONCURRENCY. Reports pages/s per worker count (median of the repeats, after a
warm-up that starts the workers) and the ratio to the engine's pages/s on an H200 from
/work/shared/gpu/README.md: preprocessing must never be the bottleneck. Also times JPEG q95
against PNG for one resized page (the encoding choice in app/documents/resize.py). Writes
bench/results/preprocess-<date>[-tag].md and .json. Needs only Pillow and pypdfium2.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from app.bench.corpus import WORDS as CORPUS_WORDS
from app.documents import resize
from app.documents.raster import Source
from app.documents.sniff import PDF
from app.documents.workers import Preprocessor

ROOT = Path(__file__).resolve().parents[2]
# vLLM 0.23 on one H200 (shared/gpu/README.md): one engine's plateau, and the best of several
ENGINE_PAGES_PER_SECOND = {"1 engine (plateau, c=64-256)": 17.0, "2 engines on one GPU": 27.2}
WORDS = (*CORPUS_WORDS[:10], "page")  # the sweep corpus's first words: pages stay as they were


def a4_page(seed: int) -> Image.Image:
    """An A4 page at 150 dpi of seeded text lines."""
    rng = random.Random(seed)  # noqa: S311 (page text, not secrets)
    page = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=20)
    for y in range(90, 1660, 32):
        draw.text(
            (100, y), " ".join(rng.choices(WORDS, k=rng.randint(4, 12))), fill="black", font=font
        )
    return page


def a4_pdf(pages: int) -> bytes:
    """A `pages`-page A4 PDF (each page an embedded 150 dpi image)."""
    images = [a4_page(i) for i in range(pages)]
    out = io.BytesIO()
    images[0].save(out, format="PDF", save_all=True, append_images=images[1:], resolution=150)
    return out.getvalue()


async def one_pass(pool: Preprocessor, source: Source) -> float:
    """Seconds to inspect the document and render every page, all pages in flight at once."""
    started = time.perf_counter()
    pages = await pool.inspect(source, None, 10_000)
    await asyncio.gather(*(pool.render(source, index) for index in pages))
    return time.perf_counter() - started


async def measure(workers: int, source: Source, pages: int, repeats: int) -> dict[str, Any]:
    """pages/s with `workers` processes: median of `repeats` passes after a warm-up pass."""
    pool = Preprocessor(workers)
    try:
        await one_pass(pool, source)  # starts the workers; imports Pillow and pdfium
        seconds = [await one_pass(pool, source) for _ in range(repeats)]
    finally:
        pool.close()
    median = statistics.median(seconds)
    return {"workers": workers, "seconds": seconds, "pages_per_second": pages / median}


def encodings(page: Image.Image, repeats: int = 5) -> dict[str, dict[str, float]]:
    """Time and size of one resized page as JPEG q95 and as PNG."""
    resized = resize.for_model(page, 112_896, 1_003_520)
    found = {}
    for fmt in ("JPEG", "PNG"):
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            data = resize.encode(resized, fmt)
            times.append(time.perf_counter() - started)
        found[fmt] = {"ms": statistics.median(times) * 1000, "kib": len(data) / 1024}
    return found


def report(results: list[dict[str, Any]], coding: dict[str, Any], meta: dict[str, Any]) -> str:
    """The markdown table of the run."""
    lines = [
        f"# Preprocessing throughput, {meta['date']}",
        "",
        f"{meta['pages']}-page A4 PDF rendered at {meta['dpi']} dpi, resized by smart_resize "
        f"(max 1,003,520 pixels), JPEG q95; {meta['cpus']} CPUs ({meta['machine']}).",
        "",
        "| workers | pages/s | seconds per pass | vs 1 engine (17 p/s) | vs 2 engines (27.2 p/s) |",
        "|--:|--:|---|--:|--:|",
    ]
    for row in results:
        rate = row["pages_per_second"]
        passes = ", ".join(f"{s:.2f}" for s in row["seconds"])
        ratios = f"{rate / 17.0:.2f}x | {rate / 27.2:.2f}x"
        lines.append(f"| {row['workers']} | {rate:.1f} | {passes} | {ratios} |")
    lines += [
        "",
        "One resized page (1,003,520-pixel bound) encoded:",
        "",
        "| format | ms | KiB |",
        "|---|--:|--:|",
        *(f"| {fmt} | {v['ms']:.1f} | {v['kib']:.0f} |" for fmt, v in coding.items()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the sweep and write the result files."""
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess")
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--workers", help="comma-separated counts (default 1,2,cores)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dpi", type=int, default=144)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    counts = sorted({int(n) for n in (args.workers or f"1,2,{cpus}").split(",")})
    document = a4_pdf(args.pages)
    with tempfile.NamedTemporaryFile(suffix=".pdf") as file:
        file.write(document)
        file.flush()
        source = Source(file.name, PDF, args.dpi, 112_896, 1_003_520, 60_000_000)
        results = []
        for workers in counts:
            row = asyncio.run(measure(workers, source, args.pages, args.repeats))
            print(f"{workers} workers: {row['pages_per_second']:.1f} pages/s", flush=True)
            results.append(row)
    coding = encodings(a4_page(0))
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "pages": args.pages,
        "dpi": args.dpi,
        "cpus": cpus,
        "machine": f"{platform.processor() or platform.machine()}, {platform.node()}",
        "engine_pages_per_second": ENGINE_PAGES_PER_SECOND,
    }
    name = f"preprocess-{meta['date']}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    text = report(results, coding, meta)
    (args.out / f"{name}.md").write_text(text)
    payload = {**meta, "results": results, "encodings": coding}
    (args.out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
