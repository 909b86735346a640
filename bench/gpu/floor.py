"""The GPU floor of one page: PaddleOCR-VL's arithmetic timed with plain torch, no serving stack.

    python -m bench.gpu.floor [--visual-tokens 1280 | --pixels 1240x1754] [--output-tokens 256]
        [--batch 256] [--encoder-batches 1,2,4,8] [--config config.json] [--out DIR]

From the model's config.json (default: app/profiles/data/paddleocr-vl-1.5/config.json; the tiny
model's works too) it builds the real layer shapes with random weights (bf16 on a GPU, float32 on
the CPU): the vision encoder (patch embedding, 27 pre-norm layers with 2-D rotary SDPA attention,
the 2x2-merge projector), the language model (18 layers, grouped-query attention, SwiGLU, the LM
head on the last token) and one decode step for `--batch` sequences at the page's mean decode
context (prompt + half the output) against a KV cache of that length. On a GPU each stage is
captured in a CUDA graph (no launch gaps; `--no-graphs` to time it eagerly) and SDPA is held to
flash attention where it takes the shapes; times are medians of CUDA-event-timed replays.

    floor ms per page = encoder ms per page (best batch) + prefill ms per page
                        + decode step ms x output tokens / batch

(one decode step serves `batch` pages at once, and a page needs `output tokens` steps). It prints
a table and writes floor.json into --out; bench.gpu.layouts' merge states each layout's pages/s
as a fraction of it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.gpu.floor_model import Shapes, Text, Vision, angles, encoder_tflop
from bench.gpu.floor_report import table

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "app" / "profiles" / "data" / "paddleocr-vl-1.5" / "config.json"
PREPROCESSOR = CONFIG.with_name("preprocessor_config.json")
TEXT_TOKENS = 10  # the bench's page: 1,280 visual + 10 text tokens = 1,290 prompt tokens


@dataclass(frozen=True)
class Page:
    """One page as the model sees it: visual tokens, patches, prompt and output tokens."""

    visual_tokens: int
    patches: int
    prompt_tokens: int
    output_tokens: int
    pixels: str | None = None  # WxH as sent, when the page was given in pixels


def page_of(shapes: Shapes, args: argparse.Namespace) -> Page:
    """The page the command line asks for, from visual tokens or from pixels (the model's
    resize rule, app/documents/resize.py, with the processor's min/max pixels)."""
    pixels = None
    visual = args.visual_tokens
    if args.pixels:
        from app.documents.resize import smart_resize  # noqa: PLC0415

        width, height = (int(side) for side in args.pixels.lower().split("x"))
        limits = json.loads(PREPROCESSOR.read_text())
        factor = shapes.patch * shapes.merge
        h, w = smart_resize(height, width, limits["min_pixels"], limits["max_pixels"], factor)
        visual, pixels = (h // factor) * (w // factor), args.pixels
    return Page(visual, visual * shapes.merge**2, visual + args.text_tokens, args.output_tokens,
                pixels)  # fmt: skip


def timed(fn: Callable[[], object], device: torch.device, graphs: bool, repeat: int) -> float:
    """Median ms of `fn`: replays of its CUDA graph (or eager calls) timed by CUDA events on a
    GPU, by the wall clock on the CPU, after warm-up calls."""
    if device.type != "cuda":
        for _ in range(2):
            fn()
        samples = []
        for _ in range(repeat):
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1000)
        return statistics.median(samples)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    call = fn
    if graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        call = graph.replay
    call()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


BACKENDS = ("flash", "cudnn", "efficient", "auto")  # SDPA's kernels; auto: SDPA's own choice


def stage(
    fn: Callable[[], object],
    device: torch.device,
    args: argparse.Namespace,
    kernels: dict[str, Any],
) -> float:
    """`timed(fn)` under each of --backends' SDPA kernels on a GPU (a refusal noted, not fatal):
    the floor is the fastest the hardware does, so the stage's time is the best of them."""
    if device.type != "cuda":
        return timed(fn, device, args.graphs, args.repeat)
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    times: dict[str, float | str] = {}
    for name in args.backends:
        try:
            if name == "auto":
                times[name] = timed(fn, device, args.graphs, args.repeat)
            else:
                with sdpa_kernel(chosen[name]):
                    times[name] = timed(fn, device, args.graphs, args.repeat)
        except RuntimeError as exc:
            times[name] = "refused: " + str(exc).splitlines()[0][:160]
    kernels.setdefault("stages", []).append(times)
    timings = [ms for ms in times.values() if isinstance(ms, float)]
    return min(timings) if timings else math.nan


def profiled(fn: Callable[[], object], device: torch.device, path: Path, title: str) -> None:
    """torch.profiler's CUDA kernel table of a few eager calls of `fn`, appended to `path`:
    where a stage's time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    for _ in range(2):
        fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize(device)
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=22, max_name_column_width=70
    )
    with path.open("a") as out:
        out.write(f"## {title} (3 eager calls)\n\n{table}\n\n")


def measure(
    s: Shapes, page: Page, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """The three stages' times and the floor they add up to."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        vision, text = Vision(s).to(dtype).eval(), Text(s).to(dtype).eval()
    v_rope = angles(page.patches, s.v_hidden // s.v_heads, device, dtype)
    encoder: list[dict[str, float]] = []
    kernels: dict[str, Any] = {}
    with torch.inference_mode():
        for pages in args.encoder_batches:
            patches = torch.randn(pages, page.patches, 3 * s.patch**2, device=device, dtype=dtype)
            ms = stage(lambda p=patches: vision(p, *v_rope), device, args, kernels)
            encoder.append({"pages": pages, "ms_per_call": ms, "ms_per_page": ms / pages})
            del patches
        prompt = torch.randn(1, page.prompt_tokens, s.t_hidden, device=device, dtype=dtype)
        p_rope = angles(page.prompt_tokens, s.head_dim, device, dtype)
        prefill = stage(lambda: text(prompt, p_rope), device, args, kernels)
        context = page.prompt_tokens + page.output_tokens // 2
        caches = [
            (torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype),
             torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype))
            for _ in range(s.t_layers)
        ]  # fmt: skip
        step = torch.randn(args.batch, 1, s.t_hidden, device=device, dtype=dtype)
        last = angles(context, s.head_dim, device, dtype)
        d_rope = (last[0][-1:], last[1][-1:])
        decode = stage(lambda: text(step, d_rope, caches), device, args, kernels)
        if args.profile and device.type == "cuda":
            path = args.out / "floor-profile.txt"
            path.unlink(missing_ok=True)
            one = torch.randn(1, page.patches, 3 * s.patch**2, device=device, dtype=dtype)
            profiled(lambda: vision(one, *v_rope), device, path, "encoder, one page")
            profiled(lambda: text(prompt, p_rope), device, path, "prefill, one page")
            profiled(
                lambda: text(step, d_rope, caches), device, path, f"decode step, {args.batch} seqs"
            )
    attention = (
        "sdpa (cpu)" if device.type != "cuda" else "sdpa, best of " + ",".join(args.backends)
    )
    best = min(encoder, key=lambda row: row["ms_per_page"])
    decode_per_page = decode * page.output_tokens / args.batch
    floor = best["ms_per_page"] + prefill + decode_per_page
    tflop = encoder_tflop(s, page.patches)
    return {
        "encoder": {"per_batch": encoder, "ms_per_page": best["ms_per_page"],
                    "best_batch": best["pages"], "tflop_per_page": tflop,
                    "tflop_per_s": tflop / best["ms_per_page"] * 1000},
        "prefill_ms_per_page": prefill,
        "decode": {"batch": args.batch, "context": context, "step_ms": decode,
                   "ms_per_page": decode_per_page},
        "floor_ms_per_page": floor,
        "floor_pages_per_s": 1000 / floor,
        "attention": attention,
        "kernels_ms": kernels.get("stages", []),  # per stage (encoder batches, prefill, decode)
        "dtype": str(dtype).removeprefix("torch."),
    }  # fmt: skip


def machine(device: torch.device) -> dict[str, Any]:
    """The device and the torch that timed it."""
    facts: dict[str, Any] = {"device": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    return facts


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    options = argparse.ArgumentParser(prog="python -m bench.gpu.floor")
    size = options.add_mutually_exclusive_group()
    size.add_argument("--visual-tokens", type=int, default=1280)
    size.add_argument("--pixels", help="WxH of the page image, resized as the model does")
    options.add_argument("--text-tokens", type=int, default=TEXT_TOKENS, help="prompt beside it")
    options.add_argument("--output-tokens", type=int, default=256)
    options.add_argument("--batch", type=int, default=256, help="sequences per decode step")
    options.add_argument("--encoder-batches", default="1,2,4,8", help="pages per encoder call")
    options.add_argument("--config", type=Path, default=CONFIG, help="the model's config.json")
    options.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    options.add_argument("--no-graphs", dest="graphs", action="store_false")
    options.add_argument("--repeat", type=int, default=20, help="timed calls per stage")
    options.add_argument("--out", type=Path, default=Path("floor-out"))
    options.add_argument("--backends", default=",".join(BACKENDS), help="SDPA kernels to time")
    options.add_argument("--profile", action="store_true", help="kernel tables: floor-profile.txt")
    return options


def main(argv: list[str] | None = None) -> int:
    """The command line: measure, print, write floor.json."""
    args = parser().parse_args(argv)
    args.encoder_batches = [int(b) for b in args.encoder_batches.split(",")]
    args.backends = [name for name in args.backends.split(",") if name]
    if unknown := set(args.backends) - set(BACKENDS):
        parser().error(f"--backends: unknown {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    args.graphs = args.graphs and device.type == "cuda"
    shapes = Shapes.read(args.config)
    page = page_of(shapes, args)
    report = {
        "tool": "bench.gpu.floor",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.gpu.floor " + " ".join(argv or sys.argv[1:]),
        "config": str(args.config),
        "shapes": asdict(shapes),
        "page": asdict(page),
        "machine": machine(device),
        "cuda_graphs": args.graphs,
    } | measure(shapes, page, args, device)
    (args.out / "floor.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    return 0 if math.isfinite(report["floor_ms_per_page"]) else 1


if __name__ == "__main__":
    sys.exit(main())
