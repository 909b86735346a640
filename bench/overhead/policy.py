"""The request policy's cost: two `ocrvl serve` side by side, with and without it, in one run.

    python -m bench.overhead.policy --baseline DIR [--candidate DIR] [--requests 2000]
                                    [--concurrency 1,32] [--bodies paddleocr,sampling]
                                    [--instructions N] [--tag T]

DIR holds an `app/` package: the gateway's code without the policy (`--baseline`) and with it
(`--candidate`; default: this tree's). Each gateway runs from its own DIR (PYTHONPATH) in front
of the same stand-in backend (bench.overhead's FakeVLLM); a client's `priority` must get 200
from the baseline and 400 from the candidate, or the run stops (each runs its own code). The
load generator alternates batches between them (ABBA, so drift hits both alike) and reads each
gateway's own CPU time (all threads, schedstat) around its batches only. Bodies: `paddleocr`
(the page PaddleOCR's client sends, ~300 KB: six fields, two of them capped) and `sampling` (the
same page with eight more sampling fields: seed, stop, top_k, n, logprobs, ...). On a shared
machine CPU time per batch moves by tens of per cent; `--instructions N` also counts each
gateway's instructions per request under callgrind (`instructions`), which do not. Prints and
writes both to bench/results/overhead-policy-<date>[-tag].md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

from app.bench.commands import levels
from bench.hey_body import build
from bench.overhead import CLIENT_KEY, MODEL, ROOT, ROUTE
from bench.overhead.instructions import instructions_per_request, policy_alone
from bench.overhead.load import Target, run_batch
from bench.overhead.pair import gateways, stand_in
from bench.overhead.processes import process_seconds
from bench.overhead.report import machine

GATEWAYS = ("baseline", "candidate")
POLICY_CALLS = 20_000  # policy.apply calls counted alone, per body
SAMPLING = {  # what a client tuning its sampling might add: all passed or within their caps
    "seed": 7, "stop": ["</s>"], "top_k": 1, "n": 1, "logprobs": False, "top_p": 1.0,
    "repetition_penalty": 1.0, "stream": False,
}  # fmt: skip


async def measure(
    urls: dict[str, str], pids: dict[str, int], body: bytes, concurrency: int, requests: int
) -> dict[str, Any]:
    """ABBA batches on both gateways: CPU µs per request each, and per-round ratios."""
    batch = max(2 * concurrency, 100)
    rounds = max(requests // batch, 2)
    rounds += rounds % 2
    cpu = dict.fromkeys(GATEWAYS, 0.0)
    count = dict.fromkeys(GATEWAYS, 0)
    per_round: dict[str, list[float]] = {name: [] for name in GATEWAYS}
    limits = httpx.Limits(max_connections=concurrency, keepalive_expiry=60)
    headers = {"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"}
    async with contextlib.AsyncExitStack() as stack:
        targets = {}
        for name in GATEWAYS:
            client = httpx.AsyncClient(limits=limits, timeout=60, trust_env=False)
            await stack.enter_async_context(client)
            targets[name] = Target(f"{urls[name]}{ROUTE}", headers, client)
            await run_batch(targets[name], body, max(2 * concurrency, 50), concurrency)  # warm
        for turn in range(rounds):
            for name in GATEWAYS if turn % 2 == 0 else GATEWAYS[::-1]:
                before = process_seconds(pids[name])
                await run_batch(targets[name], body, batch, concurrency)
                used = process_seconds(pids[name]) - before
                cpu[name] += used
                count[name] += batch
                per_round[name].append(used / batch * 1e6)
    us = {name: cpu[name] / count[name] * 1e6 for name in GATEWAYS}
    ratios = [c / b for b, c in zip(per_round["baseline"], per_round["candidate"], strict=True)]
    return {
        "concurrency": concurrency,
        "requests_each": count["baseline"],
        "rounds": rounds,
        "cpu_us_per_request": us,
        "ratio": us["candidate"] / us["baseline"],
        "median_round_ratio": statistics.median(ratios),
        "round_ratio_spread": [min(ratios), max(ratios)],
    }


def which_code(urls: dict[str, str]) -> dict[str, int]:
    """Each gateway's status for a `priority` from a client: 400 shows the policy runs there."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "OCR:"}], "priority": 1}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    return {
        name: httpx.post(f"{url}{ROUTE}", json=body, headers=headers, timeout=30).status_code
        for name, url in urls.items()
    }


def instructions(
    code: dict[str, Path], bodies: dict[str, bytes], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Per body: each gateway's instructions per request, two callgrind runs each (ABBA)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ocrvl-callgrind-") as folder:
        workdir = Path(folder)
        with stand_in(workdir) as backend:
            for body in args.bodies:
                counts: dict[str, list[float]] = {name: [] for name in GATEWAYS}
                for name in (*GATEWAYS, *GATEWAYS[::-1]):
                    counts[name].append(
                        instructions_per_request(
                            workdir, (name, code[name]), backend, bodies[body],
                            requests=args.instructions,
                        )
                    )  # fmt: skip
                    print(f"  counted {body} {name}", file=sys.stderr)
                means = {name: statistics.mean(values) for name, values in counts.items()}
                ratio = means["candidate"] / means["baseline"]
                alone = policy_alone(workdir, bodies[body], POLICY_CALLS)
                rows.append({"body": body, "requests_per_run": args.instructions, "runs": counts,
                             "instructions_per_request": means, "ratio": ratio,
                             "policy_apply_instructions": alone})  # fmt: skip
    return rows


def instruction_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the instruction counts."""
    lines = [
        "| body | requests per run | baseline instructions/req | with policy instructions/req "
        "| added per request | ratio | `policy.apply` alone | its share of a request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        means, alone = row["instructions_per_request"], row["policy_apply_instructions"]
        added = means["candidate"] - means["baseline"]
        lines.append(
            f"| {row['body']} | {row['requests_per_run']} | {means['baseline']:,.0f} "
            f"| {means['candidate']:,.0f} | {added:+,.0f} | {row['ratio']:.4f} "
            f"| {alone:,.0f} | {alone / means['baseline']:.2%} |"
        )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    """The .md report: both tables and how they were measured."""
    code, statuses, loads = (
        report["code"],
        report["client_priority_status"],
        report["load_average_1min"],
    )
    text = (
        f"# Request policy: gateway CPU per request, side by side\n\n`{report['command']}`\n\n"
        f"{table(report['rows'])}\n\nratio = with policy / baseline, over all rounds; each round "
        f"is one batch on each gateway (ABBA order). Code: baseline `{code['baseline']}`, with "
        f"policy `{code['candidate']}`; a client's `priority` got {statuses['baseline']} from "
        f"the baseline and {statuses['candidate']} with the policy (each runs its own code). "
        f"Load average (1 min) {loads[0]:.1f} before, {loads[1]:.1f} after, on "
        f"{report['machine']['nproc']} cores.\n"
    )
    if report["instructions"]:
        text += (
            "\n## Instructions per request (callgrind)\n\n"
            f"{instruction_table(report['instructions'])}\n\nEach gateway alone under valgrind, "
            "c=1, counting switched on after a warm-up; two runs each in ABBA order. "
            "Instructions do not move with the machine's load as CPU time does, but whole "
            "requests still differ by a per cent or two between runs of the same code; "
            f"`policy.apply` alone is counted over {POLICY_CALLS:,} calls in a process of its "
            "own (minus the same process making none), its share against the baseline's "
            "request.\n"
        )
    return text


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows."""
    lines = [
        "| body | c | requests each | baseline µs CPU/req | with policy µs CPU/req | ratio "
        "| median of round ratios (min-max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        us, spread = row["cpu_us_per_request"], row["round_ratio_spread"]
        lines.append(
            f"| {row['body']} | {row['concurrency']} | {row['requests_each']} "
            f"| {us['baseline']:.0f} | {us['candidate']:.0f} | {row['ratio']:.3f} "
            f"| {row['median_round_ratio']:.3f} ({spread[0]:.2f}-{spread[1]:.2f}) |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.overhead.policy")
    parser.add_argument("--baseline", type=Path, required=True, help="DIR with app/, no policy")
    parser.add_argument("--candidate", type=Path, default=ROOT, help="DIR with app/ (default .)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per gateway, cell")
    parser.add_argument("--concurrency", type=levels, default=[1, 32])
    parser.add_argument("--bodies", type=lambda t: t.split(","), default=["paddleocr", "sampling"])
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        help="also count each gateway's instructions per request under callgrind, over this "
        "many requests per run (two runs each, ABBA; needs valgrind); 0: off",
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run both gateways side by side; print and write the comparison."""
    args = parse_args(argv)
    page = build(MODEL, 4096, seed=0)
    bodies = {"paddleocr": orjson.dumps(page), "sampling": orjson.dumps(page | SAMPLING)}
    rows = []
    load_before = os.getloadavg()[0]
    code = {"baseline": args.baseline.resolve(), "candidate": args.candidate.resolve()}
    with (
        tempfile.TemporaryDirectory(prefix="ocrvl-policy-") as workdir,
        gateways(Path(workdir), code) as (urls, pids),
    ):
        statuses = which_code(urls)
        if code["baseline"] != code["candidate"] and statuses != {
            "baseline": 200,
            "candidate": 400,
        }:
            sys.exit(f"a client's priority got {statuses}: is --baseline the code without it?")
        for concurrency in args.concurrency:
            for name in args.bodies:
                cell = uvloop.run(measure(urls, pids, bodies[name], concurrency, args.requests))
                rows.append({"body": name, **cell})
                print(f"  measured {name} c={concurrency}", file=sys.stderr)
    counted = instructions(code, bodies, args) if args.instructions else []
    command = " ".join([".venv/bin/python -m bench.overhead.policy", *(argv or sys.argv[1:])])
    report: dict[str, Any] = {
        "command": command,
        "machine": machine(),
        "code": {k: str(v) for k, v in code.items()},
        "client_priority_status": statuses,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "rows": rows,
        "instructions": counted,
    }
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    stem = args.out / f"overhead-policy-{stamp}{'-' + args.tag if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    print(table(rows))
    if counted:
        print(instruction_table(counted))
    print(f"wrote {stem}.md and {stem}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
