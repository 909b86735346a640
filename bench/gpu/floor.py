"""The floor of a page: PaddleOCR-VL's own arithmetic timed with plain torch, no serving stack.

    python -m bench.gpu.floor --work work.json --variant whole|blocks [--out DIR]
    python -m bench.gpu.floor [--visual-tokens 1280] [--output-tokens 256]   # one standard page
        [--batch 256] [--encoder-batches 1,8] [--backends cudnn,flash,efficient,auto]
        [--config config.json] [--device cpu] [--repeat 20]

From the model's config.json (default app/profiles/data/paddleocr-vl-1.5/config.json; the tiny
model's works too) it builds the real layer shapes with random weights (bf16 on a GPU, float32
on the CPU): floor_model.py's encoder, language model and LM head, **the rotary left out**. On
the idle GPU each stage is a CUDA graph timed by CUDA events under each SDPA kernel of
`--backends`, **the fastest kept per stage** (floor_timing.py). `--work` is
`python -m bench.gpu.corpus work`'s list: per page its requests, [visual tokens, output tokens]
each (`whole`: one per page; `blocks`: one per block a layout read sends). DEFINITION is the one
rule both variants use:
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.gpu.floor_model import Shapes, Text, Vision, encoder_tflop
from bench.gpu.floor_timing import BACKENDS, stage

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "app" / "profiles" / "data" / "paddleocr-vl-1.5" / "config.json"
TEXT_TOKENS = 10  # the prompt beside each image's visual tokens
DEFINITION = (
    "mean over the corpus's pages of: for each request of the page (a whole page, or each block "
    "a layout read sends), the encoder's ms for its image at its best batch of --encoder-batches "
    "+ the prefill's ms for its visual + 10 text tokens; plus one decode step's ms for --batch "
    "sequences at the requests' mean context (prompt + half the output) x the page's output "
    "tokens / --batch. PaddleOCR-VL's arithmetic in plain torch, rotary left out, each stage "
    "the fastest SDPA backend, CUDA graphs, on the idle GPU in the pass itself"
)
Work = list[list[list[int]]]  # pages -> requests -> [visual tokens, output tokens]


def build(s: Shapes, device: torch.device) -> tuple[Vision, Text, torch.dtype]:
    """The encoder and language model with seeded random weights (bf16 on a GPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        return Vision(s).to(dtype).eval(), Text(s).to(dtype).eval(), dtype


def floor(work: Work, s: Shapes, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """DEFINITION for `work`: ms per page and every stage's time it was built from."""
    vision, text, dtype = build(s, device)
    kernels: dict[str, Any] = {}
    sizes: dict[int, dict[str, Any]] = {}
    requests = [r for page in work for r in page]
    with torch.inference_mode():
        for visual in sorted({v for v, _ in requests}):
            patches = visual * s.merge**2
            encoder = {}
            for images in args.encoder_batches:
                x = torch.randn(images, patches, 3 * s.patch**2, device=device, dtype=dtype)
                encoder[images] = stage(lambda x=x: vision(x), device, args, kernels) / images
                del x
            prompt = torch.randn(1, visual + TEXT_TOKENS, s.t_hidden, device=device, dtype=dtype)
            prefill = stage(lambda p=prompt: text(p), device, args, kernels)
            best = min(encoder, key=lambda b: encoder[b])
            sizes[visual] = {"encoder_ms": encoder[best], "best_batch": best,
                             "encoder_ms_by_batch": encoder, "prefill_ms": prefill,
                             "tflop": encoder_tflop(s, patches)}  # fmt: skip
        context = round(statistics.fmean(v + TEXT_TOKENS + o / 2 for v, o in requests))
        caches = [(torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device,
                               dtype=dtype),
                   torch.randn(args.batch, s.t_kv_heads, context, s.head_dim, device=device,
                               dtype=dtype)) for _ in range(s.t_layers)]  # fmt: skip
        step = torch.randn(args.batch, 1, s.t_hidden, device=device, dtype=dtype)
        decode = stage(lambda: text(step, caches), device, args, kernels)
    per_page = [
        sum(sizes[v]["encoder_ms"] + sizes[v]["prefill_ms"] for v, _ in page)
        + decode * sum(o for _, o in page) / args.batch
        for page in work
    ]
    return {
        "ms_per_page": statistics.fmean(per_page),
        "definition": DEFINITION,
        "pages": len(work),
        "requests_per_page": len(requests) / len(work),
        "output_tokens_per_page": sum(o for _, o in requests) / len(work),
        "decode": {"batch": args.batch, "context": context, "step_ms": decode},
        "sizes": {str(v): row for v, row in sizes.items()},
        "kernels_ms": kernels.get("stages", []),
        "dtype": str(dtype).removeprefix("torch."),
    }  # fmt: skip


def machine(device: torch.device) -> dict[str, Any]:
    """The device and the torch that timed it."""
    facts: dict[str, Any] = {"device": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                  "cuda": torch.version.cuda}  # fmt: skip
    return facts


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="python -m bench.gpu.floor")
    options.add_argument("--work", type=Path, help="bench.gpu.corpus work's JSON")
    options.add_argument("--variant", choices=("whole", "blocks"), default="whole")
    options.add_argument("--visual-tokens", type=int, default=1280, help="without --work")
    options.add_argument("--output-tokens", type=int, default=256, help="without --work")
    options.add_argument("--batch", type=int, default=256, help="sequences per decode step")
    options.add_argument("--encoder-batches", default="1,8", help="images per encoder call")
    options.add_argument("--config", type=Path, default=CONFIG, help="the model's config.json")
    options.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    options.add_argument("--no-graphs", dest="graphs", action="store_false")
    options.add_argument("--repeat", type=int, default=20, help="timed calls per stage")
    options.add_argument("--backends", default=",".join(BACKENDS), help="SDPA kernels to time")
    options.add_argument("--out", type=Path, default=Path("floor-out"))
    return options


def main(argv: list[str] | None = None) -> int:
    """Measure, print one line, write OUT/floor-VARIANT.json; exit 1 on a non-finite floor."""
    args = parser().parse_args(argv)
    args.encoder_batches = [int(b) for b in args.encoder_batches.split(",")]
    args.backends = [name for name in args.backends.split(",") if name]
    if unknown := set(args.backends) - set(BACKENDS):
        parser().error(f"--backends: unknown {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    device = torch.device(args.device)
    args.graphs = args.graphs and device.type == "cuda"
    if args.work:
        work: Work = json.loads(args.work.read_text())[args.variant]
    else:
        work = [[[args.visual_tokens, args.output_tokens]]]
    report = {
        "tool": "bench.gpu.floor",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.gpu.floor " + " ".join(argv or sys.argv[1:]),
        "variant": args.variant if args.work else "one page",
        "config": str(args.config),
        "machine": machine(device),
        "cuda_graphs": args.graphs,
        "attention": "sdpa, best of " + ",".join(args.backends) if args.graphs else "sdpa",
    } | floor(work, Shapes.read(args.config), args, device)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"floor-{args.variant if args.work else 'page'}.json"
    (args.out / name).write_text(json.dumps(report, indent=1) + "\n")
    print(f"floor ({report['variant']}): {report['ms_per_page']:.2f} ms a page, "
          f"{1000 / report['ms_per_page']:.1f} pages/s; {report['requests_per_page']:.1f} "
          f"requests, {report['output_tokens_per_page']:.0f} output tokens a page",
          flush=True)  # fmt: skip
    return 0 if math.isfinite(report["ms_per_page"]) else 1


if __name__ == "__main__":
    sys.exit(main())
