"""Load one endpoint for a steady window, closed or open loop, and keep every request's times.

    python3 -m bench.gpu.steady URL --name NAME --out DIR [--api chat|layout|ocr [--layout on]]
        (--concurrency C [--ramp 10] | --rate R) [--window 120] [--latencies 10]
        [--max-seconds 330] [--metrics URL ...] [--corpus 2000] [--max-tokens 256]
        [--tail-seconds 12 --tail-command CMD]

The load is `ocrvl bench sweep`'s (app/bench/load.py: PaddleOCR's chat body around a synthetic
A4 page, 256 output tokens forced by `ignore_eos`, one HTTP client and connection per request
in flight), or with `--api layout` one page per `POST /v1/layout`, or with `--api ocr` one
page of the document corpus (bench/gpu/docpages.py: seven realistic blocks at fixed places) per
`POST /v1/ocr` with `layout` `--layout` and `max_tokens` `--max-tokens` (per block with a layout,
per page without; bench/gpu/apis.py); the window and its figures follow `bench.gpu.method`.
Closed loop: C clients started evenly over the ramp, each sending its next page when its answer
is in. Open loop: Poisson arrivals at R pages/s, each on a client of its own. The window is
decided online and the load then stops (requests still in flight are cancelled, so the engine
aborts them; they are kept as `cancelled`). With a tail, the load goes on `--tail-seconds` past
the window while `--tail-command` runs (bench/gpu/watch.sh's py-spy capture): outside the
window, so the profiler never touches a figure.

Pages are drawn in a seeded order and cycled: the GPU profiles turn the prefix cache and the
multimodal processor cache off, so a page sent twice costs what it did the first time.

Writes DIR/NAME.requests.csv (every request: client, start, end, status, tokens; seconds from
the load's start), NAME.metrics.jsonl (every /metrics URL every 2 s), NAME.gpu.csv
(nvidia-smi every second, where there is one), NAME.apps.csv (each GPU process's memory, the
same) and NAME.json (settings, the window's figures,
vLLM's own count and phases over it, GPU busy, the load generator's CPU and lateness).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from app.bench.corpus import Page, synthetic
from app.bench.load import Shape, Target, auth
from app.bench.stats import spread
from bench.gpu import apis, docpages, method, samplers

TICK = 0.05  # seconds between looks at the event loop's lateness (app/bench/load.py's LAG_TICK)


def cycled(pages: list[Page], seed: int) -> Iterator[Page]:
    """The pages in a seeded order, reshuffled after each pass through them."""
    chance = random.Random(seed)  # noqa: S311 (a reproducible order)
    for _ in itertools.count():
        order = list(range(len(pages)))
        chance.shuffle(order)
        yield from (pages[i] for i in order)
    raise AssertionError  # unreachable: the loop is endless


class Load:
    """One run: its target, pages and records, and the window once it is decided."""

    def __init__(self, args: argparse.Namespace, target: Target, pages: list[Page]) -> None:
        self.args, self.target = args, target
        self.pages = cycled(pages, args.seed)
        shape = Shape(max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
        self.counts = apis.OcrCounts()
        if args.api == "layout":
            self.send = apis.layout(target)
        elif args.api == "ocr":
            self.send = apis.ocr(target, layout=args.layout, max_tokens=args.max_tokens,
                                 counts=self.counts)  # fmt: skip
        else:
            self.send = apis.chat(target, shape)
        self.records: list[method.Record] = []
        self.flying: dict[int, tuple[int, float]] = {}  # id: (client, start)
        self.began = time.perf_counter()
        self.window: tuple[float, float] | None = None
        self.capped = False
        self.stop = asyncio.Event()
        self.lags: list[float] = []
        self.cpu = (0.0, 0.0)  # process CPU seconds at the window's start and end
        self.timeout = httpx.Timeout(args.timeout, connect=10.0)

    def now(self) -> float:
        return time.perf_counter() - self.began

    def client(self) -> httpx.AsyncClient:
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        return httpx.AsyncClient(limits=one, timeout=self.timeout, trust_env=False)

    async def one(self, http: httpx.AsyncClient, worker: int) -> None:
        """A request, recorded whatever becomes of it (cancelled ones by `finish`)."""
        key = id(asyncio.current_task())
        self.flying[key] = (worker, self.now())
        outcome = await self.send(http, next(self.pages))
        # to the 0.1 ms the CSV keeps, so its figures are the report's to the last answer
        start, end = round(outcome.start - self.began, 4), round(outcome.end - self.began, 4)
        self.records.append(method.Record(worker, start, end, str(outcome.status), outcome.tokens))
        del self.flying[key]

    async def closed_client(self, worker: int, delay: float) -> None:
        await asyncio.sleep(delay)
        async with self.client() as http:
            while not self.stop.is_set():
                await self.one(http, worker)

    async def open_arrivals(self, times: list[float]) -> None:
        idle: list[httpx.AsyncClient] = []
        tasks: set[asyncio.Task[None]] = set()

        async def arrival() -> None:
            http = idle.pop() if idle else self.client()
            try:
                await self.one(http, -1)
            finally:
                idle.append(http)

        try:
            for at in times:
                await asyncio.sleep(max(0.0, at - self.now()))
                task = asyncio.create_task(arrival())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(http.aclose() for http in idle), return_exceptions=True)

    def window_start(self) -> float | None:
        if self.args.rate:
            return method.open_start(self.records, self.args.settle)
        return method.closed_start(self.records, self.args.concurrency, self.args.ramp)

    async def control(self) -> None:
        """Decide the window once a second; then the tail, then stop."""
        start = None
        while self.window is None:
            await asyncio.sleep(1.0)
            now = self.now()
            if start is None and (start := self.window_start()) is not None:
                self.cpu = (time.process_time(), 0.0)
            end = None
            if start is not None:
                rules = {"window": self.args.window, "latencies": self.args.latencies}
                end = method.window_end(self.records, start, now, **rules)
            if end is not None or now >= self.args.max_seconds:
                self.capped = end is None  # the rules were not met in time: not a steady window
                self.window = (start if start is not None else 0.0, end or now)
        self.cpu = (self.cpu[0], time.process_time())
        if self.args.tail_seconds and self.args.tail_command:
            tail = await asyncio.create_subprocess_shell(self.args.tail_command)
            await asyncio.sleep(self.args.tail_seconds)
            await tail.wait()
        self.stop.set()

    async def lateness(self) -> None:
        while not self.stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            self.lags.append(max(0.0, time.perf_counter() - before - TICK))

    async def run(self) -> None:
        args = self.args
        if args.rate:
            schedule = method.poisson(args.rate, args.max_seconds + args.tail_seconds, args.seed)
            loads = [asyncio.create_task(self.open_arrivals(schedule))]
        else:
            starts = method.ramp(args.concurrency, args.ramp)
            loads = [asyncio.create_task(self.closed_client(i, at)) for i, at in enumerate(starts)]
        helpers = [asyncio.create_task(self.control()), asyncio.create_task(self.lateness())]
        await self.stop.wait()
        ended = self.now()
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, *helpers, return_exceptions=True)
        for worker, start in self.flying.values():
            self.records.append(method.Record(worker, round(start, 4), round(ended, 4),
                                              method.CANCELLED))  # fmt: skip


async def model_of(url: str, key: str) -> str:
    """The model the endpoint serves (its /v1/models' first)."""
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        reply = await client.get(f"{url}/v1/models", headers=auth(key))
        reply.raise_for_status()
        return str(reply.json()["data"][0]["id"])


def ocr_window(load: Load, start: float, end: float) -> dict[str, Any]:
    """What the `/v1/ocr` answers of requests started in [start, end] said: blocks read per
    page, prompt tokens per page (visual + text, summed over its blocks), the answers' `layout`
    (a fallback to whole pages shows here) and the pages' error codes."""
    counts = load.counts

    def inside(pairs: list[tuple[float, int]]) -> list[float]:
        return [float(n) for at, n in pairs if start <= at - load.began <= end]

    blocks, prompts = inside(counts.blocks), inside(counts.prompt_tokens)
    return {
        "pages": len(blocks),
        "blocks_per_page": spread(blocks) if blocks else None,
        "prompt_tokens_per_page": spread(prompts) if prompts else None,
        "layouts": dict(counts.layouts),
        "page_errors": dict(counts.errors),
    }


def write_records(path: Path, records: list[method.Record]) -> None:
    with path.open("w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["worker", "start", "end", "status", "tokens"])
        for r in sorted(records, key=lambda r: r.start):
            rows.writerow([r.worker, f"{r.start:.4f}", f"{r.end:.4f}", r.status, r.tokens])


def read_records(path: Path) -> list[method.Record]:
    """A run's requests back from its CSV (the figures can be recomputed from it)."""
    with path.open() as source:
        return [method.Record(int(row["worker"]), float(row["start"]), float(row["end"]),
                              row["status"], int(row["tokens"]))
                for row in csv.DictReader(source)]  # fmt: skip


async def measure(args: argparse.Namespace, pages: list[Page]) -> dict[str, Any]:
    """Run the load with its samplers; the report (also written to OUT/NAME.json)."""
    out, name = args.out, args.name
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or ("layout" if args.api == "layout" else await model_of(args.url, args.key))
    load = Load(args, Target(name, args.url, args.key, model), pages)
    began_epoch = time.time()
    metrics_path, gpu_path = out / f"{name}.metrics.jsonl", out / f"{name}.gpu.csv"
    apps_path = out / f"{name}.apps.csv"
    with samplers.gpu(gpu_path, apps_path) as has_gpu:
        async with samplers.sampling(args.metrics, args.metrics_interval, load.began, metrics_path):
            await load.run()
    assert load.window is not None  # noqa: S101 (run() returns once control() decided it)
    start, end = load.window
    write_records(out / f"{name}.requests.csv", load.records)
    figures = method.figures(
        load.records,
        start,
        end,
        None if args.rate else args.concurrency,
        window=args.window,
        latencies=args.latencies,
    )
    figures["steady"] = figures["steady"] and not load.capped
    report = {
        "tool": "bench.gpu.steady",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python3 -m bench.gpu.steady " + " ".join(sys.argv[1:]),
        "name": name,
        "target": {"url": args.url, "model": model, "metrics": args.metrics},
        "loop": "open" if args.rate else "closed",
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "key", "metrics")},
        "window_rule": "capped by --max-seconds" if load.capped else "met",
        "figures": figures,
        "engine": samplers.engine_window(metrics_path, start, end),
        "layout_service": samplers.layout_window(metrics_path, start, end)
        if args.api in ("layout", "ocr")
        else None,
        "ocr": ocr_window(load, start, end) if args.api == "ocr" else None,
        "gpu": samplers.gpu_window(gpu_path, began_epoch, start, end) if has_gpu else None,
        "gpu_processes": samplers.apps_window(apps_path, began_epoch, start, end)
        if has_gpu
        else None,
        "load_generator": {"cpu_s_in_window": load.cpu[1] - load.cpu[0],
                           "loop_lag_s": spread(load.lags)},
        "requests": len(load.records),
        "files": [p.name for p in (out / f"{name}.requests.csv", metrics_path, gpu_path,
                                   apps_path) if p.exists()],
    }  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def line(report: dict[str, Any]) -> str:
    """One line for the log: the window's two pages/s, p50/p99 and whether it was steady."""
    f = report["figures"]
    lat = f["latency_s"] or {}
    return (f"{report['name']}: {report['loop']} {f['answered']} answered in {f['seconds']:.0f} s "
            f"({f['latencies_held']:.1f} latencies, steady {f['steady']}): "
            f"{f['pages_per_s_count']:.2f} pages/s by count, {f['pages_per_s_little']:.2f} by "
            f"Little, p50 {lat.get('p50', 0):.2f} s, p99 {lat.get('p99', 0):.2f} s, "
            f"statuses {f['statuses']}")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="python3 -m bench.gpu.steady")
    options.add_argument("url", help="base URL (the gateway's, an engine's, the layout service's)")
    options.add_argument("--api", choices=("chat", "layout", "ocr"), default="chat")
    options.add_argument("--layout", choices=("on", "off"), default="on", help="--api ocr's")
    options.add_argument("--name", required=True)
    options.add_argument("--out", type=Path, required=True)
    loop = options.add_mutually_exclusive_group(required=True)
    loop.add_argument("--concurrency", type=int, help="closed loop: clients")
    loop.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    options.add_argument("--ramp", type=float, default=10.0, help="closed: s to start clients over")
    options.add_argument("--settle", type=float, default=2.0, help="open: mean latencies to skip")
    options.add_argument("--window", type=float, default=method.WINDOW_S)
    options.add_argument("--latencies", type=float, default=method.LATENCIES)
    options.add_argument("--max-seconds", type=float, default=330.0, help="the whole load's cap")
    options.add_argument("--key", default="")
    options.add_argument("--model")
    options.add_argument("--metrics", action="append", default=[], help="a /metrics URL")
    options.add_argument("--metrics-interval", type=float, default=2.0)
    options.add_argument("--corpus", type=int, default=2000, help="synthetic pages, cycled")
    options.add_argument("--max-tokens", type=int, default=256)
    options.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--timeout", type=float, default=600.0)
    options.add_argument("--tail-seconds", type=float, default=0.0)
    options.add_argument("--tail-command", default="")
    return options


def main(argv: list[str] | None = None) -> int:
    """The command line: one steady window; exit 1 when it was not steady or had errors."""
    args = parser().parse_args(argv)
    pages = docpages.corpus(args.corpus) if args.api == "ocr" else synthetic(args.corpus)
    report = asyncio.run(measure(args, pages))
    print(line(report), flush=True)
    figures = report["figures"]
    return 0 if figures["steady"] and set(figures["statuses"]) <= {"200"} else 1


if __name__ == "__main__":
    sys.exit(main())
