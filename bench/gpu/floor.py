"""The GPU floor of one page: PaddleOCR-VL's arithmetic timed with plain torch, no serving stack.

    python -m bench.gpu.floor [--visual-tokens 1280 | --pixels 1240x1754] [--output-tokens 256]
        [--batch 256] [--encoder-batches 1,2,4,8] [--rotary unfused,fused,none]
        [--backends flash,cudnn,efficient,auto] [--config config.json] [--out DIR] [--profile]
        [--mix 176,315,172,...]   # a page read as blocks: each block's visual tokens

From the model's config.json (default: app/profiles/data/paddleocr-vl-1.5/config.json; the tiny
model's works too) it builds the real layer shapes with random weights (bf16 on a GPU, float32 on
the CPU): the vision encoder (patch embedding, 27 pre-norm layers with 2-D rotary SDPA attention,
the 2x2-merge projector), the language model (18 layers, grouped-query attention, SwiGLU, the LM
head on the last token) and one decode step for `--batch` sequences at the page's mean decode
context (prompt + half the output) against a KV cache of that length. On a GPU each stage is
captured in a CUDA graph (no launch gaps; `--no-graphs` to time it eagerly) and timed under each
SDPA kernel of `--backends`, the fastest kept; times are medians of CUDA-event-timed replays.

    floor ms per page = encoder ms per page (best batch) + prefill ms per page
                        + decode step ms x output tokens / batch

(one decode step serves `batch` pages at once, and a page needs `output tokens` steps). With
`--mix`, the page is read as blocks (the document path with a layout: bench/gpu/docpages.py's
`mix`), each block a request of its own visual tokens and `--output-tokens`:

    floor ms per page = sum over blocks (encoder ms per block at its size + prefill ms)
                        + decode step ms x output tokens x blocks / batch

(each distinct block size timed once, the encoder at each `--encoder-batches` size, the best
kept; the decode step at the blocks' mean context). Each mode
of `--rotary` is one line of the floor (floor_model.py says how each applies it; `fused` also
records its kernel's error against the arithmetic): it prints a table per line and writes
floor-MODE.json into --out, and floor.json for the first (what bench.gpu.layouts' merge reads).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.gpu.floor_model import (
    ROTARY,
    InPlace,
    Shapes,
    Text,
    Vision,
    angles,
    encoder_tflop,
    fused_kernel,
    rope_for,
    rotary,
)
from bench.gpu.floor_report import table
from bench.gpu.floor_timing import (
    BACKENDS,
    profiled,
    stage,
    timed,  # noqa: F401 (bench.gpu.encoder_check times with floor.timed)
)

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


Models = tuple[Vision, Text, torch.dtype]


def build(s: Shapes, device: torch.device) -> Models:
    """The encoder and language model with seeded random weights (bf16 on a GPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        return Vision(s).to(dtype).eval(), Text(s).to(dtype).eval(), dtype


def measure(
    models: Models, s: Shapes, page: Page, args: argparse.Namespace, *,
    device: torch.device, mode: str, kernel: InPlace | None,
) -> dict[str, Any]:  # fmt: skip
    """The three stages' times with the rotary applied as `mode` says, and their floor."""
    vision, text, dtype = models
    heads = [s.t_heads, s.t_kv_heads, s.t_kv_heads]
    v_rope = rope_for(mode, *angles(page.patches, s.v_hidden // s.v_heads, device, dtype),
                      kernel, [])  # fmt: skip
    encoder: list[dict[str, float]] = []
    kernels: dict[str, Any] = {}
    with torch.inference_mode():
        for pages in args.encoder_batches:
            patches = torch.randn(pages, page.patches, 3 * s.patch**2, device=device, dtype=dtype)
            ms = stage(lambda p=patches: vision(p, v_rope), device, args, kernels)
            encoder.append({"pages": pages, "ms_per_call": ms, "ms_per_page": ms / pages})
            del patches
        prompt = torch.randn(1, page.prompt_tokens, s.t_hidden, device=device, dtype=dtype)
        p_rope = rope_for(mode, *angles(page.prompt_tokens, s.head_dim, device, dtype), kernel,
                          heads)  # fmt: skip
        prefill = stage(lambda: text(prompt, p_rope), device, args, kernels)
        context = page.prompt_tokens + page.output_tokens // 2
        caches = [
            (torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype),
             torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype))
            for _ in range(s.t_layers)
        ]  # fmt: skip
        step = torch.randn(args.batch, 1, s.t_hidden, device=device, dtype=dtype)
        last = angles(context, s.head_dim, device, dtype)
        d_rope = rope_for(mode, last[0][-1:], last[1][-1:], kernel, heads)
        decode = stage(lambda: text(step, d_rope, caches), device, args, kernels)
        if args.profile and device.type == "cuda":
            path = args.out / "floor-profile.txt"
            one = torch.randn(1, page.patches, 3 * s.patch**2, device=device, dtype=dtype)
            profiled(lambda: vision(one, v_rope), device, path, f"{mode}: encoder, one page")
            profiled(lambda: text(prompt, p_rope), device, path, f"{mode}: prefill, one page")
            profiled(lambda: text(step, d_rope, caches), device, path,
                     f"{mode}: decode step, {args.batch} seqs")  # fmt: skip
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


def measure_mix(
    models: Models, s: Shapes, mix: list[int], args: argparse.Namespace, *,
    device: torch.device, mode: str, kernel: InPlace | None,
) -> dict[str, Any]:  # fmt: skip
    """`measure` for a page read as blocks of `mix` visual tokens (see the module's doc)."""
    vision, text, dtype = models
    heads = [s.t_heads, s.t_kv_heads, s.t_kv_heads]
    kernels: dict[str, Any] = {}
    sizes: dict[int, dict[str, Any]] = {}
    with torch.inference_mode():
        for visual in sorted(set(mix)):
            patches, prompt_tokens = visual * s.merge**2, visual + args.text_tokens
            v_rope = rope_for(mode, *angles(patches, s.v_hidden // s.v_heads, device, dtype),
                              kernel, [])  # fmt: skip
            per_batch = []
            for blocks in args.encoder_batches:
                x = torch.randn(blocks, patches, 3 * s.patch**2, device=device, dtype=dtype)
                ms = stage(lambda p=x, r=v_rope: vision(p, r), device, args, kernels)
                per_batch.append({"pages": blocks, "ms_per_call": ms, "ms_per_page": ms / blocks})
                del x
            prompt = torch.randn(1, prompt_tokens, s.t_hidden, device=device, dtype=dtype)
            p_rope = rope_for(mode, *angles(prompt_tokens, s.head_dim, device, dtype), kernel,
                              heads)  # fmt: skip
            prefill = stage(lambda x=prompt, r=p_rope: text(x, r), device, args, kernels)
            best = min(per_batch, key=lambda row: row["ms_per_page"])
            sizes[visual] = {"visual_tokens": visual, "patches": patches,
                             "encoder_per_batch": per_batch, "encoder_ms": best["ms_per_page"],
                             "best_batch": best["pages"], "prefill_ms": prefill,
                             "tflop": encoder_tflop(s, patches)}  # fmt: skip
        context = round(sum(mix) / len(mix)) + args.text_tokens + args.output_tokens // 2
        caches = [
            (torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype),
             torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device, dtype=dtype))
            for _ in range(s.t_layers)
        ]  # fmt: skip
        step = torch.randn(args.batch, 1, s.t_hidden, device=device, dtype=dtype)
        last = angles(context, s.head_dim, device, dtype)
        d_rope = rope_for(mode, last[0][-1:], last[1][-1:], kernel, heads)
        decode = stage(lambda: text(step, d_rope, caches), device, args, kernels)
    attention = (
        "sdpa (cpu)" if device.type != "cuda" else "sdpa, best of " + ",".join(args.backends)
    )
    encoder_ms = sum(sizes[v]["encoder_ms"] for v in mix)
    prefill_ms = sum(sizes[v]["prefill_ms"] for v in mix)
    decode_per_page = decode * args.output_tokens * len(mix) / args.batch
    floor = encoder_ms + prefill_ms + decode_per_page
    tflop = sum(sizes[v]["tflop"] for v in mix)
    per_batch = [{"pages": b, "ms_per_page": sum(
        next(r["ms_per_page"] for r in sizes[v]["encoder_per_batch"] if r["pages"] == b)
        for v in mix)} for b in args.encoder_batches]  # fmt: skip
    return {
        "mix": {"blocks": mix, "sizes": list(sizes.values())},
        "encoder": {"per_batch": per_batch, "ms_per_page": encoder_ms,
                    "best_batch": "per block size", "tflop_per_page": tflop,
                    "tflop_per_s": tflop / encoder_ms * 1000},
        "prefill_ms_per_page": prefill_ms,
        "decode": {"batch": args.batch, "context": context, "step_ms": decode,
                   "ms_per_page": decode_per_page},
        "floor_ms_per_page": floor,
        "floor_pages_per_s": 1000 / floor,
        "attention": attention,
        "kernels_ms": kernels.get("stages", []),
        "dtype": str(dtype).removeprefix("torch."),
    }  # fmt: skip


def rotary_check(
    s: Shapes, page: Page, device: torch.device, kernel: InPlace, dtype: torch.dtype | None = None
) -> dict[str, float]:
    """The fused kernel against the arithmetic on fresh random q/k of the page's encoder and
    prompt sizes: ||fused - unfused|| / ||unfused|| (bf16 operands: 1e-3 to 1e-2 is right); the
    kernel gets cos/sin in q/k's dtype (bf16 on a GPU), as the Triton one asserts."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    errors = {}
    shapes = {
        "encoder": (page.patches, s.v_heads, s.v_hidden // s.v_heads),
        "language model": (page.prompt_tokens, s.t_heads + s.t_kv_heads, s.head_dim),
    }
    for name, (n, heads, dim) in shapes.items():
        cos, sin = angles(n, dim, device, torch.float32)
        x = torch.randn(1, n, heads, dim, device=device, dtype=dtype)
        want = rotary(x.float().transpose(1, 2), cos, sin).transpose(1, 2)
        got = x.clone()
        kernel(
            got,
            cos[:, : dim // 2].to(dtype).contiguous(),
            sin[:, : dim // 2].to(dtype).contiguous(),
        )
        errors[name] = float((got.float() - want).norm() / want.norm())
    return errors  # fmt: skip


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
    options.add_argument("--output-tokens", type=int, default=256, help="per page (per block)")
    options.add_argument("--mix", help="a page read as blocks: each one's visual tokens (a,b,…)")
    options.add_argument("--batch", type=int, default=256, help="sequences per decode step")
    options.add_argument("--encoder-batches", default="1,2,4,8", help="pages per encoder call")
    options.add_argument("--config", type=Path, default=CONFIG, help="the model's config.json")
    options.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    options.add_argument("--no-graphs", dest="graphs", action="store_false")
    options.add_argument("--repeat", type=int, default=20, help="timed calls per stage")
    options.add_argument("--out", type=Path, default=Path("floor-out"))
    options.add_argument("--backends", default=",".join(BACKENDS), help="SDPA kernels to time")
    options.add_argument("--profile", action="store_true", help="kernel tables: floor-profile.txt")
    options.add_argument(
        "--rotary",
        default="unfused",
        help="comma-separated, each one floor line: " + ", ".join(ROTARY),
    )
    return options


KERNELS = {"unfused": "eager arithmetic: cat, neg, two muls and an add on each of q and k",
           "none": "left out"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """The command line: measure each rotary mode, print, write floor-MODE.json (and floor.json
    for the first mode, what `bench.gpu.layouts merge` reads)."""
    args = parser().parse_args(argv)
    args.encoder_batches = [int(b) for b in args.encoder_batches.split(",")]
    args.backends = [name for name in args.backends.split(",") if name]
    modes = [mode for mode in args.rotary.split(",") if mode]
    if unknown := set(args.backends) - set(BACKENDS):
        parser().error(f"--backends: unknown {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    if not modes or set(modes) - set(ROTARY):
        parser().error(f"--rotary: one or more of {', '.join(ROTARY)}; got {args.rotary!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "floor-profile.txt").unlink(missing_ok=True)
    device = torch.device(args.device)
    args.graphs = args.graphs and device.type == "cuda"
    shapes = Shapes.read(args.config)
    page = page_of(shapes, args)
    mix = [int(tokens) for tokens in args.mix.split(",")] if args.mix else []
    if mix:  # the page as its blocks: their tokens summed, an answer of output tokens each
        page = Page(sum(mix), sum(mix) * shapes.merge**2, sum(mix) + len(mix) * args.text_tokens,
                    args.output_tokens * len(mix))  # fmt: skip
    models = build(shapes, device)
    kernel, fused_name = fused_kernel(device) if "fused" in modes else (None, "")
    finite = True
    for number, mode in enumerate(modes):
        report = {
            "tool": "bench.gpu.floor",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": "python -m bench.gpu.floor " + " ".join(argv or sys.argv[1:]),
            "config": str(args.config),
            "shapes": asdict(shapes),
            "page": asdict(page),
            "machine": machine(device),
            "cuda_graphs": args.graphs,
            "rotary": mode,
            "rotary_kernel": fused_name if mode == "fused" else KERNELS[mode],
        } | (
            measure_mix(models, shapes, mix, args, device=device, mode=mode, kernel=kernel)
            if mix
            else measure(models, shapes, page, args, device=device, mode=mode, kernel=kernel)
        )
        if mode == "fused" and kernel is not None:
            report["rotary_check"] = rotary_check(shapes, page, device, kernel)
        text = json.dumps(report, indent=1) + "\n"
        (args.out / f"floor-{mode}.json").write_text(text)
        if number == 0:
            (args.out / "floor.json").write_text(text)
        print(table(report) + "\n", flush=True)
        finite = finite and math.isfinite(report["floor_ms_per_page"])
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
