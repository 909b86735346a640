"""How bench.gpu.floor times a stage: CUDA graphs and events on a GPU, the best SDPA kernel,
the wall clock on the CPU."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

BACKENDS = ("flash", "cudnn", "efficient", "auto")  # SDPA's kernels; auto: SDPA's own choice


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
