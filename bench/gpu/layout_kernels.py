"""The layout model's GPU time per page: its kernels' own time, not its forward's wall time.

    python -m bench.gpu.layout_kernels MODEL_DIR [--batches 1,2,4,8] [--repeat 20]
        [--device cuda|cpu] [--compile] --out FILE.json

The layout service (engine/layout/ocrvl_layout) is host-bound on a GPU: a forward's wall time
(its /metrics) is mostly Python and launches, not the GPU's work, so it overstates the layout
stage's share of a page's GPU time (issue 36: <= 10 %). For each batch size B this loads the
checkpoint as the service does (`LayoutModel`: bf16 on CUDA, fp32 on the CPU; `--compile` as
the service's --compile, its compilation in the warm-up), builds B pages of the document corpus
(bench/gpu/docpages.py drawn and resized as the service resizes them), runs 3 warm-up passes,
then times `repeat` passes three ways:

- wall: perf_counter around `detect` (forward, post-processing, a synchronize);
- event: CUDA events on the current stream around the forward alone (`outputs`); GPU only;
- kernel: torch.profiler over `repeat` passes of `outputs`, every CUDA device event's own time
  (kernels, memcpy, memset) summed ÷ repeat, and how many there were per pass: the GPU's busy
  time for the layout stage, whatever the host did between launches. On the CPU (the
  rehearsal) the top-level ops' CPU time instead, `"timer": "cpu-ops"`: no GPU figure.

It prints a table and writes the JSON bench.gpu.doc_report reads (RESULTS/layout-kernels.json).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from ocrvl_layout.model import BatchPage, LayoutModel
from PIL import Image

from bench.gpu.docpages import draw

WARM_UP = 3
THRESHOLD = 0.3  # the service's default score threshold for transformers' post-processing


def pages(model: LayoutModel, count: int) -> list[BatchPage]:
    """`count` corpus pages at the model's input size, each with the size it was drawn at."""
    made = []
    for number in range(count):
        image = np.asarray(Image.open(io.BytesIO(draw(number))).convert("RGB"))
        height, width = image.shape[:2]
        made.append(BatchPage(model.preprocessing.resize(image), width, height, THRESHOLD))
    return made


def kernel_time(model: LayoutModel, pixels: np.ndarray, repeat: int) -> tuple[float, float, str]:
    """(ms, events) per pass of `outputs` under torch.profiler, and what timed them."""
    cuda = model.device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(repeat):
            model.outputs(pixels)
        if cuda:
            torch.cuda.synchronize(model.device)
    if cuda:  # every device event (kernel, memcpy, memset): its own time on the GPU
        device = [e for e in prof.key_averages() if e.device_type == torch.profiler.DeviceType.CUDA]
        total_us = sum(e.self_device_time_total for e in device)
        count = sum(e.count for e in device)
        return total_us / 1000 / repeat, count / repeat, "cuda-kernels"
    top = [e for e in prof.events() if e.cpu_parent is None and not e.is_async]
    total_us = sum(e.cpu_time_total for e in top)
    return total_us / 1000 / repeat, len(top) / repeat, "cpu-ops"


def measure(model: LayoutModel, size: int, repeat: int) -> dict[str, Any]:
    """One batch size's figures: wall, CUDA-event and kernel ms per pass and per page."""
    batch = pages(model, size)
    pixels = np.stack([page.pixels for page in batch])
    began = time.perf_counter()
    for _ in range(WARM_UP):
        model.detect(batch)
    warm_up_s = time.perf_counter() - began
    walls = []
    for _ in range(repeat):
        began = time.perf_counter()
        model.detect(batch)  # synchronizes on CUDA
        walls.append((time.perf_counter() - began) * 1000)
    event_ms = None
    if model.device.type == "cuda":
        timings = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model.outputs(pixels)
            end.record()
            end.synchronize()
            timings.append(start.elapsed_time(end))
        event_ms = sum(timings) / repeat
    try:
        kernel_ms, kernels, timer = kernel_time(model, pixels, repeat)
    except Exception as error:  # no CUPTI on the host: the events' time, an upper bound
        if event_ms is None:
            raise
        print(f"B={size}: torch.profiler failed ({error}); kernel time = CUDA events' time")
        kernel_ms, kernels, timer = event_ms, 0.0, "cuda-events"
    wall = sum(walls) / repeat
    return {
        "warm_up_s": warm_up_s,
        "wall_ms_per_pass": wall,
        "wall_ms_per_page": wall / size,
        "event_ms_per_pass": event_ms,
        "event_ms_per_page": event_ms / size if event_ms is not None else None,
        "kernel_ms_per_pass": kernel_ms,
        "kernel_ms_per_page": kernel_ms / size,
        "kernels_per_pass": kernels,
        "timer": timer,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['gpu'] or report['device']}, {report['dtype']}, compile {report['compile']}, "
        f"input {report['input'][0]}x{report['input'][1]}, {report['repeat']} passes, "
        f"timer {report['timer']}",
        f"{'B':>3} {'wall ms/pass':>13} {'event ms/pass':>14} {'kernel ms/pass':>15} "
        f"{'kernel ms/page':>15} {'kernels/pass':>13}",
    ]
    for size, line in report["batches"].items():
        event = line["event_ms_per_pass"]
        lines.append(
            f"{size:>3} {line['wall_ms_per_pass']:>13.2f} "
            f"{'-' if event is None else f'{event:.2f}':>14} {line['kernel_ms_per_pass']:>15.2f} "
            f"{line['kernel_ms_per_page']:>15.3f} {line['kernels_per_pass']:>13.0f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.layout_kernels")
    parser.add_argument("model", type=Path, help="a PP-DocLayoutV3 checkpoint folder")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--compile", action="store_true", help="torch.compile, as the service's")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.batches.split(",") if size]
    began = time.perf_counter()
    model = LayoutModel(args.model, args.device, compile=args.compile)
    load_s = time.perf_counter() - began
    measured = {str(size): measure(model, size, args.repeat) for size in sizes}
    cuda = model.device.type == "cuda"
    report = {
        "tool": "bench.gpu.layout_kernels",
        "device": model.device.type,
        "gpu": torch.cuda.get_device_name(model.device) if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(model.dtype).removeprefix("torch."),
        "compile": args.compile,
        "load_s": load_s,
        "warm_up_s": sum(line["warm_up_s"] for line in measured.values()),
        "input": [model.preprocessing.width, model.preprocessing.height],
        "repeat": args.repeat,
        "timer": ",".join(sorted({line["timer"] for line in measured.values()})),
        "batches": measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
