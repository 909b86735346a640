"""`ocrvl bench sweep`: argparse only; the sweep itself loads when the command runs."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TASKS = ("ocr", "table", "formula", "chart")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def duration(text: str) -> float:
    """'60s', '2m', '1h' or plain seconds."""
    match = DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"a duration like 60s, 2m or 90; got {text!r}")
    return float(match[1]) * {"s": 1, "m": 60, "h": 3600, None: 1}[match[2]]


def levels(text: str) -> list[int]:
    """'1,2,4,8' as a list of positive integers."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated positive integers; got {text!r}")
    return values


def _label(url: str) -> str:
    return urlsplit(url).netloc or url


def _sweep(args: argparse.Namespace) -> int:
    from app.bench.load import Shape  # noqa: PLC0415
    from app.bench.sweep import Config, main  # noqa: PLC0415

    urls = [u.rstrip("/") for u in [args.url, *args.compare]]
    keys = [args.key] + [args.compare_key or args.key] * len(args.compare)
    labels = args.labels.split(",") if args.labels else [_label(u) for u in urls]
    if len(labels) != len(urls) or len(set(labels)) != len(labels):
        print(f"ocrvl bench sweep: --labels needs {len(urls)} distinct names", file=sys.stderr)
        return 2
    if args.duration is None and args.requests is None:
        args.requests = 100
    out = args.out or Path(f"sweep-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    shape = Shape(args.task, args.max_tokens, args.ignore_eos, args.stream)
    config = Config(
        urls=urls, keys=keys, labels=labels, levels=args.concurrency, model=args.model,
        requests=args.requests, duration=args.duration, warmup=args.warmup, pages=args.pages,
        corpus=args.corpus, resized=args.resized, shape=shape, metrics_urls=args.metrics_url,
        metrics_interval=args.metrics_interval, max_error_rate=args.max_error_rate, ramp=args.ramp,
        timeout=args.timeout, out=out, name=args.name, plot=not args.no_plot,
        command=shlex.join(["ocrvl", "bench", "sweep", *sys.argv[3:]])
        if sys.argv[1:3] == ["bench", "sweep"]
        else "ocrvl bench sweep (called in-process)",
    )  # fmt: skip
    try:
        result = main(config)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"ocrvl bench sweep: {exc}", file=sys.stderr)
        return 2
    from app.bench.report import results_table  # noqa: PLC0415

    print(results_table(result))
    return 1 if result["stopped"] else 0


def register(commands: Any) -> None:
    """Add `bench sweep` to the `ocrvl` command tree (`commands`: its subparsers)."""
    bench = commands.add_parser("bench", help="load tools (install the `bench` extra)")
    actions = bench.add_subparsers(metavar="ACTION", required=True)
    sweep = actions.add_parser(
        "sweep",
        help="concurrency sweep: pages/s and latency per level, table and plot",
        description="Closed-loop concurrency sweep against vLLM, the gateway or nginx. Writes "
        "NAME.json, NAME.md and NAME.png into --out. Exit status 1 when a level's error rate "
        "passed --max-error-rate (the sweep stopped there).",
    )
    add = sweep.add_argument
    add("--url", required=True, help="base URL of the target (vLLM, gateway or nginx), no /v1")
    add("--key", default=os.environ.get("OCRVL_BENCH_KEY", ""),
        help="bearer key (default OCRVL_BENCH_KEY)")  # fmt: skip
    add("--model", help="model name to send (default: the first of each target's /v1/models)")
    add("--concurrency", type=levels, default=[1, 2, 4, 8, 16, 32],
        help="comma-separated levels (default 1,2,4,8,16,32)")  # fmt: skip
    length = sweep.add_mutually_exclusive_group()
    length.add_argument("--duration", type=duration, help="measured time per level, e.g. 60s")
    length.add_argument("--requests", type=int, help="measured requests per level (default 100)")
    add("--warmup", type=int, help="unmeasured requests before each level (default: its C)")
    add("--ramp", type=float,
        help="seconds over which C requests start (default: about one latency)")  # fmt: skip
    add("--pages", default="synthetic", help="'synthetic' or a folder of page images")
    add("--corpus", type=int, default=1000,
        help="synthetic pages with --duration; a level ends early when it has sent them all "
        "(it never sends an image twice). With --requests it is sized to fit")  # fmt: skip
    add("--resized", action="store_true",
        help="send every page already at the model's size (PaddleOCR-VL's smart_resize within "
        "the min/max pixels each request carries, JPEG q95), as /v1/ocr does: the engine's "
        "own resize then changes nothing")  # fmt: skip
    add("--task", choices=TASKS, default="ocr", help="PaddleOCR-VL task prompt (default ocr)")
    add("--max-tokens", type=int, default=1024, help="max_completion_tokens (default 1024)")
    add("--ignore-eos", action="store_true",
        help="send vLLM's ignore_eos: answers are max-tokens long (random weights)")  # fmt: skip
    add("--stream", action="store_true", help="stream the answers and measure time to first token")
    add("--compare", action="append", default=[], metavar="URL2",
        help="also run every level against URL2, interleaved (repeatable)")  # fmt: skip
    add("--compare-key", default=os.environ.get("OCRVL_BENCH_COMPARE_KEY"),
        help="key of --compare targets (default OCRVL_BENCH_COMPARE_KEY or --key)")  # fmt: skip
    add("--labels", help="comma-separated names of the targets (default host:port)")
    add("--metrics-url", action="append", default=[],
        help="vLLM /metrics URL to sample (repeatable, one per engine; default: the target's "
        "own /metrics when it is vLLM's)")  # fmt: skip
    add("--metrics-interval", type=float, default=0.5, help="seconds between metric samples")
    add("--max-error-rate", type=float, default=0.1,
        help="stop after a level whose error rate passes this (default 0.1)")  # fmt: skip
    add("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    add("--out", type=Path, help="output folder (default ./sweep-<UTC time>)")
    add("--name", default="sweep", help="stem of the output files (default sweep)")
    add("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    sweep.set_defaults(func=_sweep)
