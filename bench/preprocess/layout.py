"""The layout path's host work: pages/s and rasterisings per page, cache off, missing, hitting.

    python -m bench.preprocess.layout [--pages 24] [--workers 1] [--repeats 3] [--dpi 144]
                                      [--label T] [--tag T] [--out DIR]

Runs the gateway's own page pipeline on every page of bench.preprocess's A4 PDF, 8 pages in
flight as /v1/ocr's default: `parse_page` (app/documents/parsing.py), behind
`PageCache.page` (app/documents/cache.py, a SQLite results cache in a temporary folder) where
the cache is on, with the gateway's `Preprocessor` (`--workers` processes). In place of the
layout service, an in-process stand-in that answers at once with four boxes labelled `image`:
kept as images (cropped and encoded, never sent), so that no block reaches an engine and what
is timed is the host work alone (rasterising, the layout page's JPEG, the hash, the crops, the
markdown). Arms, each timed over the whole document, median of `--repeats` after a warm-up:

    off    no cache (OCRVL_CACHE=off, or a request's `cache: false`)
    miss   the cache on, every page new (a fresh document): hashed, then read
    hit    the same pages again: hashed, answered from the cache

Besides the wall time, the CPU time of the pass (this process and its children, the workers,
from /proc: what a shared machine's load does not inflate) per page. The workers count their
own rasterisings (tests/support/rasterising.py). Run it once per checkout with `--label`, from
the old checkout's folder with PYTHONPATH=<old checkout>:<this one> for the old `app`: each run
adds its rows to bench/results/preprocess-layout-DATE[TAG].{json,md}, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import app
from app.context import RequestContext
from app.documents.blocks import Box
from app.documents.cache import PageCache, options_of
from app.documents.job import OcrJob, PageResult
from app.documents.layout_options import LayoutOptions
from app.documents.layouts import Located
from app.documents.parsing import Pipeline, parse_page
from app.documents.raster import Source
from app.documents.sniff import PDF
from app.documents.workers import Preprocessor
from app.metrics import Metrics
from app.store.results import SqliteResults
from bench.overhead.report import machine
from bench.preprocess.__main__ import ROOT, a4_pdf
from tests.support.rasterising import counting, rasterisings

CONCURRENCY = 8  # OCRVL_OCR_PAGE_CONCURRENCY's default
ARMS = ("off", "miss", "hit")


class StandinLayout:
    """The layout service's place: four `image` boxes, the page's quarters, for every page."""

    async def locate(
        self, image_url: str, size: tuple[int, int], options: LayoutOptions, request_id: str
    ) -> Located:
        """The page's quarters as its layout (what the service would answer, at once)."""
        width, height = size
        quarters = [
            (x, y, x + width / 2, y + height / 2) for y in (0, height / 2) for x in (0, width / 2)
        ]
        boxes = [Box(3, "image", 0.9, quarter, None) for quarter in quarters]
        return Located(boxes, size)


async def _never() -> Any:
    await asyncio.Event().wait()


def cpu_seconds() -> float:
    """CPU seconds of this process and of its living children (the page workers)."""
    tick, me, total = os.sysconf("SC_CLK_TCK"), os.getpid(), time.process_time()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == me:  # ppid; then utime and stime at 11 and 12
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def one_pass(job: OcrJob, pipeline: Pipeline, cache: PageCache | None) -> tuple[float, float]:
    """(seconds, CPU seconds) to read every page of `job`, CONCURRENCY at a time; every page
    must succeed."""
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int) -> PageResult:
        async with slots:
            context = RequestContext()
            if cache is None:
                return await parse_page(job, index, pipeline, context, _never)
            return await cache.page(
                job, index, pipeline.preprocessor,
                lambda *seen: parse_page(job, index, pipeline, context, _never, **_held(seen)),
            )  # fmt: skip

    started, cpu = time.perf_counter(), cpu_seconds()
    pages = await asyncio.gather(*(one(index) for index in job.pages))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    failed = [page.error for page in pages if page.error is not None]
    assert not failed, failed  # noqa: S101 (a benchmark of pages that must be read)
    return seconds, cpu


def _held(seen: tuple[Any, ...]) -> dict[str, Any]:
    """`parse_page`'s `held` where the cache hands it over (since 2026-12-05; not before)."""
    return {"held": seen[1]} if len(seen) > 1 else {}


async def measure(
    source: Source, pages: int, workers: int, repeats: int, log: Path
) -> list[dict[str, Any]]:
    """Each arm's passes: seconds, pages/s (median) and rasterisings per page."""
    job = OcrJob(source, list(range(pages)), "ocr", "bench", None, layout=LayoutOptions())
    options = options_of(job, None)
    rows = []
    with tempfile.TemporaryDirectory() as data_dir, counting(log):
        pool = Preprocessor(workers)
        store = SqliteResults(Path(data_dir), ttl=3600, max_bytes=1 << 30)
        await store.open()
        layout: Any = StandinLayout()
        pipeline = Pipeline(pool, None, layout, asyncio.Semaphore(32))  # type: ignore[arg-type]
        try:
            await one_pass(job, pipeline, None)  # starts the workers; imports Pillow and pdfium
            rasterisings(log)
            for arm in ARMS:
                seconds, cpu, counts = [], [], []
                for n in range(repeats):
                    cache = None
                    if arm != "off":  # a miss reads under a scope of its own; a hit, the last's
                        scope = f"repeat-{n}" if arm == "miss" else "repeat-0"
                        cache = PageCache.scoped(store, scope, options, Metrics())
                    wall, used = await one_pass(job, pipeline, cache)
                    seconds.append(wall)
                    cpu.append(used)
                    counts.append(sum(rasterisings(log).values()) / pages)
                median = statistics.median(seconds)
                rows.append({
                    "arm": arm, "seconds": seconds, "cpu_seconds": cpu,
                    "pages_per_second": pages / median,
                    "cpu_ms_per_page": statistics.median(cpu) / pages * 1000,
                    "rasterisings_per_page": statistics.median(counts),
                })  # fmt: skip
                print(
                    f"{arm}: {pages / median:.1f} pages/s, "
                    f"{rows[-1]['cpu_ms_per_page']:.1f} CPU ms a page, "
                    f"{counts[-1]:g} rasterisings a page"
                )
        finally:
            await store.close()
            pool.close()
    return rows


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The markdown table: one row per run (label) and arm."""
    lines = [
        f"# The layout path's host work, {meta['date']}",
        "",
        f"{meta['pages']}-page A4 PDF (bench.preprocess's, embedded 150-dpi images) at "
        f"{meta['dpi']} dpi through `parse_page` (and `PageCache.page`), {CONCURRENCY} pages in "
        f"flight, {meta['workers']} page worker(s), a stand-in layout service answering four "
        f"image boxes; {meta['cpus']} CPUs ({runs[-1]['machine']['cpu']}). Median of "
        f"{meta['repeats']} "
        "passes.",
        "",
        "| code | arm | pages/s | seconds per pass | CPU ms per page | rasterisings per page |",
        "|---|---|--:|---|--:|--:|",
    ]
    for run in runs:
        for row in run["rows"]:
            passes = ", ".join(f"{s:.2f}" for s in row["seconds"])
            lines.append(
                f"| {run['label']} | {row['arm']} | {row['pages_per_second']:.1f} | {passes} | "
                f"{row['cpu_ms_per_page']:.1f} | {row['rasterisings_per_page']:g} |"
            )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    """Run the arms and write (or add to) the result files."""
    parser = argparse.ArgumentParser(prog="python -m bench.preprocess.layout")
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dpi", type=int, default=144)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "doc.pdf"
        path.write_bytes(a4_pdf(args.pages))
        source = Source(str(path), PDF, args.dpi, 112_896, 1_003_520, 60_000_000)
        log = Path(folder) / "rasterisings.log"
        rows = asyncio.run(measure(source, args.pages, args.workers, args.repeats, log))
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"), "pages": args.pages, "dpi": args.dpi,
        "workers": args.workers, "repeats": args.repeats,
        "cpus": len(os.sched_getaffinity(0)),
    }  # fmt: skip
    name = f"preprocess-layout-{meta['date']}{args.tag}"
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / f"{name}.json"
    runs = json.loads(saved.read_text())["runs"] if saved.exists() else []
    this = {
        "label": args.label, "rows": rows, "machine": machine(), "load_after": os.getloadavg(),
        "app": str(Path(app.__file__).parent),  # the checkout measured (machine(): the bench's)
    }  # fmt: skip
    runs = [run for run in runs if run["label"] != args.label] + [this]
    saved.write_text(json.dumps({**meta, "runs": runs}, indent=2) + "\n")
    text = report(runs, meta)
    (args.out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
