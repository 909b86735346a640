"""Gateway overhead: one stand-in backend called directly and through `ocrvl serve`, interleaved.

    python -m bench.overhead [--requests 200] [--concurrency 1,32] [--modes json,stream]
                             [--pin] [--rewrite] [--backend-delay-ms 0] [--tag T] [--out DIR]

Three processes. The backend is a stand-in for vLLM (tests.support.fake_backend.FakeVLLM under
uvicorn with uvloop and httptools) that answers at once: with near-zero service time, what the
two paths differ by is the gateway, not engine noise. The gateway is a real `ocrvl serve` with
production defaults (access log at info, its stderr to a file). This script is the load
generator, one keep-alive httpx client per target on its own event loop. Every request carries
a ~300 KB JPEG page in the body PaddleOCR's client sends. Direct and gateway batches alternate
(ABBA) so drift on a noisy machine hits both alike. Prints p50/p99 of each path, the added
latency, the gateway's own `ocrvl_gateway_overhead_seconds` mean and each process's CPU time
per request; writes bench/results/overhead-<date>[-tag].md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.hey_body import build
from tests.support.pages import document_page
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLIENT_KEY = "sk-bench-client"
BACKEND_KEY = "sk-bench-backend"
MODEL = "PaddleOCR-VL-1.5-0.9B"  # what PaddleOCR's client sends; docker-compose serves this name
REWRITTEN = "paddleocr-vl-served"  # --rewrite: a served name the gateway must rewrite the body to
ROUTE = "/v1/chat/completions"
TARGETS = ("direct", "gateway")
PROCESSES = ("backend", "gateway", "load_generator", "others")
TARGET_P50, TARGET_P99 = 0.001, 0.003  # the budget for added latency
PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "httpx", "httpcore", "orjson")
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')
Scrape = Callable[[], Awaitable[tuple[float, float, float]]]


# ------------------------------------------------------------------------------- the processes


class _Discard(list[Any]):
    """A list that keeps nothing: the stand-in records every body, a benchmark needs none."""

    def append(self, item: Any) -> None:
        pass


class _Paced:
    """Holds each chat answer back by `delay` seconds: a stand-in service time (default none)."""

    def __init__(self, app: ASGIApp, delay: float) -> None:
        self.app = app
        self.delay = delay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def paced(message: Message) -> None:
            if message["type"] == "http.response.start":
                await asyncio.sleep(self.delay)
            await send(message)

        chat = scope["type"] == "http" and scope["path"] == ROUTE
        await self.app(scope, receive, paced if chat else send)


def serve_backend(port: int, served: str, delay: float) -> None:
    """Run the stand-in vLLM on `port` until terminated (the benchmark's backend subprocess)."""
    import uvicorn  # noqa: PLC0415

    from tests.support.fake_backend import FakeVLLM  # noqa: PLC0415

    backend: ASGIApp = FakeVLLM(served=served, bodies=_Discard(), headers=_Discard())
    if delay > 0:
        backend = _Paced(backend, delay)
    uvicorn.run(
        backend,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


@dataclass
class Servers:
    """The running backend and gateway."""

    backend: str
    gateway: str
    gateway_log: Path
    pids: dict[str, int]


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{url}: exited with {process.returncode}\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    sys.exit(f"{url} not ready after 30 s\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pin(pid: int, cpus: set[int]) -> None:
    """Bind every thread of `pid` to `cpus` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def running(workdir: Path, args: argparse.Namespace) -> Iterator[Servers]:
    """Start the stand-in backend and `ocrvl serve` in front of it; stop both at the end."""
    backend_port, gateway_port = free_port(), free_port()
    backend_url = f"http://127.0.0.1:{backend_port}"
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    gateway_env = {
        **clean,
        "OCRVL_BACKENDS": backend_url,
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_LOG_LEVEL": "info",  # the production default: the access line is part of the cost
    }
    backend_cmd = [sys.executable, "-m", "bench.overhead", "--serve-backend", str(backend_port)]
    backend_cmd += ["--served", REWRITTEN if args.rewrite else MODEL]
    backend_cmd += ["--backend-delay-ms", str(args.backend_delay_ms)]
    gateway_cmd = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        backend_log, gateway_log = workdir / "backend.log", workdir / "gateway.log"
        processes.append(_spawn(backend_cmd, backend_log, clean))
        _wait_ready(f"{backend_url}/health", processes[0], backend_log)
        processes.append(
            _spawn([*gateway_cmd, "--port", str(gateway_port)], gateway_log, gateway_env)
        )
        _wait_ready(f"{gateway_url}/ready", processes[1], gateway_log)
        pids = {"backend": processes[0].pid, "gateway": processes[1].pid}
        if args.pin:  # the gateway gets a core of its own; backend and load generator share one
            pin(pids["gateway"], {1})
            pin(pids["backend"], {0})
            pin(os.getpid(), {0})
        yield Servers(backend_url, gateway_url, gateway_log, pids)
    finally:
        for process in reversed(processes):
            _stop(process)


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far (user + system, all threads) by our processes and everyone else."""
    used = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        used[name] = (int(fields[11]) + int(fields[12])) / TICK
    used["load_generator"] = time.process_time()
    user, nice, system, _, _, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    ours = used["backend"] + used["gateway"] + used["load_generator"]
    used["others"] = (user + nice + system + irq + softirq) / TICK - ours
    return used


# ------------------------------------------------------------------------------------ the load


@dataclass
class Target:
    """One way to the backend: its chat URL, headers and keep-alive client."""

    url: str
    headers: dict[str, str]
    client: httpx.AsyncClient


async def run_batch(
    target: Target, body: bytes, count: int, concurrency: int
) -> tuple[list[float], float]:
    """Send `count` requests, `concurrency` at a time; their latencies and the batch's seconds."""
    latencies: list[float] = []
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            async with target.client.stream(
                "POST", target.url, content=body, headers=target.headers
            ) as response:
                async for _ in response.aiter_raw():
                    pass
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"{target.url} answered {response.status_code}")

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - began


def overhead_histogram(text: str) -> tuple[float, float, float]:
    """(sum, count, count at or under 1 ms) of the chat route's gateway-overhead histogram."""
    found = {"sum": 0.0, "count": 0.0, "fast": 0.0}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or not match[1].startswith("ocrvl_gateway_overhead_seconds"):
            continue
        labels = dict(LABEL.findall(match[2]))
        if labels.get("route") != ROUTE:
            continue
        kind = match[1].rsplit("_", 1)[1]
        if kind in ("sum", "count"):
            found[kind] = float(match[3])
        elif kind == "bucket" and float(labels["le"]) == TARGET_P50:
            found["fast"] = float(match[3])
    return found["sum"], found["count"], found["fast"]


@dataclass
class Cell:
    """One mode at one concurrency: both paths' latencies, CPU use and the gateway's own view."""

    mode: str
    concurrency: int
    batch: int
    rounds: int
    latencies: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0.0))
    cpu: dict[str, dict[str, float]] = field(
        default_factory=lambda: {t: dict.fromkeys(PROCESSES, 0.0) for t in TARGETS}
    )
    self_measured: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])


async def measure(
    targets: dict[str, Target], scrape: Scrape, pids: dict[str, int], body: bytes, cell: Cell
) -> Cell:
    """Warm both paths up, then alternate direct and gateway batches (ABBA)."""
    for target in targets.values():
        await run_batch(target, body, max(2 * cell.concurrency, 20), cell.concurrency)
    for turn in range(cell.rounds):
        for name in TARGETS if turn % 2 == 0 else TARGETS[::-1]:
            before = await scrape() if name == "gateway" else None
            cpu_before = cpu_seconds(pids)
            latencies, seconds = await run_batch(targets[name], body, cell.batch, cell.concurrency)
            cpu_after = cpu_seconds(pids)
            cell.latencies[name] += latencies
            cell.seconds[name] += seconds
            for process in PROCESSES:
                cell.cpu[name][process] += cpu_after[process] - cpu_before[process]
            if before is not None:
                after = await scrape()
                for i, (old, new) in enumerate(zip(before, after, strict=True)):
                    cell.self_measured[i] += new - old
    return cell


async def measure_all(servers: Servers, args: argparse.Namespace, body: bytes) -> list[Cell]:
    """Every mode at every concurrency, against both paths."""
    limits = httpx.Limits(max_connections=max(args.concurrency), keepalive_expiry=60)
    async with (
        httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as direct,
        httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as gateway,
    ):
        json_type = {"content-type": "application/json"}
        targets = {
            "direct": Target(
                f"{servers.backend}{ROUTE}",
                {**json_type, "authorization": f"Bearer {BACKEND_KEY}"},
                direct,
            ),
            "gateway": Target(
                f"{servers.gateway}{ROUTE}",
                {**json_type, "authorization": f"Bearer {CLIENT_KEY}"},
                gateway,
            ),
        }

        async def scrape() -> tuple[float, float, float]:
            response = await gateway.get(f"{servers.gateway}/metrics")
            return overhead_histogram(response.text)

        cells = []
        for mode in args.modes:
            payload = body if mode == "json" else body[:-1] + b',"stream":true}'
            for concurrency in args.concurrency:
                batch = max(2 * concurrency, math.ceil(args.requests / 8))
                rounds = math.ceil(args.requests / batch)
                cell = Cell(mode, concurrency, batch, rounds + rounds % 2)
                cells.append(await measure(targets, scrape, servers.pids, payload, cell))
                print(f"  measured {mode} c={concurrency}", file=sys.stderr)
        return cells


# ---------------------------------------------------------------------------------- the report


def quantile(values: list[float], q: float) -> float:
    """The q-quantile, linearly interpolated between the closest ranks."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(cell: Cell) -> dict[str, Any]:
    """The cell's numbers: latencies in ms, CPU in ms per request, others' load in cores."""
    row: dict[str, Any] = {"mode": cell.mode, "concurrency": cell.concurrency}
    for name in TARGETS:
        values = cell.latencies[name]
        row[name] = {
            "n": len(values),
            "p50_ms": quantile(values, 0.5) * 1000,
            "p99_ms": quantile(values, 0.99) * 1000,
            "mean_ms": sum(values) / len(values) * 1000,
            "requests_per_s": len(values) / cell.seconds[name],
            "cpu_ms_per_request": {
                p: cell.cpu[name][p] / len(values) * 1000 for p in PROCESSES if p != "others"
            },
            "other_processes_cores": cell.cpu[name]["others"] / cell.seconds[name],
        }
    added_p50 = row["gateway"]["p50_ms"] - row["direct"]["p50_ms"]
    added_p99 = row["gateway"]["p99_ms"] - row["direct"]["p99_ms"]
    total, count, fast = cell.self_measured
    row["added"] = {
        "p50_ms": added_p50,
        "p99_ms": added_p99,
        "meets_target": added_p50 <= TARGET_P50 * 1000 and added_p99 <= TARGET_P99 * 1000,
    }
    row["gateway_self_measured"] = {
        "observations": count,
        "mean_ms": total / count * 1000 if count else math.nan,
        "share_at_or_under_1ms": fast / count if count else math.nan,
    }
    return row


def latency_table(rows: list[dict[str, Any]]) -> str:
    """Latencies and the added latency as a markdown table."""
    lines = [
        "| mode | c | n each | direct p50 | direct p99 | gateway p50 | gateway p99 "
        "| **added p50** | **added p99** | target | gateway self-measured mean (≤1 ms) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|",
    ]
    for r in rows:
        direct, gateway, added = r["direct"], r["gateway"], r["added"]
        own = r["gateway_self_measured"]
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {direct['n']} "
            f"| {direct['p50_ms']:.2f} | {direct['p99_ms']:.2f} "
            f"| {gateway['p50_ms']:.2f} | {gateway['p99_ms']:.2f} "
            f"| **{added['p50_ms']:+.2f}** | **{added['p99_ms']:+.2f}** "
            f"| {'meets' if added['meets_target'] else 'misses'} "
            f"| {own['mean_ms']:.2f} ({own['share_at_or_under_1ms']:.0%}) |"
        )
    return "\n".join(lines)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    """Throughput and CPU time per request of each process as a markdown table."""
    lines = [
        "| mode | c | direct req/s | gateway req/s | backend CPU/req | **gateway CPU/req** "
        "| load generator CPU/req (direct, gateway) | other processes, cores (direct, gateway) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        direct, gateway = r["direct"], r["gateway"]
        load = (
            direct["cpu_ms_per_request"]["load_generator"],
            gateway["cpu_ms_per_request"]["load_generator"],
        )
        # tick-based accounting puts small negative noise on an idle machine: show it as 0
        others = (max(direct["other_processes_cores"], 0), max(gateway["other_processes_cores"], 0))
        lines.append(
            f"| {r['mode']} | {r['concurrency']} "
            f"| {direct['requests_per_s']:.0f} | {gateway['requests_per_s']:.0f} "
            f"| {direct['cpu_ms_per_request']['backend']:.2f} "
            f"| **{gateway['cpu_ms_per_request']['gateway']:.2f}** "
            f"| {load[0]:.2f}, {load[1]:.2f} | {others[0]:.2f}, {others[1]:.2f} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """Facts about the machine and the software measured."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "")
    meminfo = Path("/proc/meminfo").read_text().split()
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run([*git, "status", "--porcelain", "app"], capture_output=True, check=False)
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
        "packages": {name: metadata.version(name) for name in PACKAGES},
        "git_commit": commit.stdout.strip(),
        "app_modified_since_commit": bool(dirty.stdout),
    }


def batches(cells: list[dict[str, Any]]) -> str:
    """The batch plan per concurrency, e.g. `1: 25x8, 32: 64x4`."""
    plan = {c["concurrency"]: f"{c['batch']}x{c['rounds']}" for c in cells}
    return ", ".join(f"c={c}: {p}" for c, p in plan.items())


def pacing(delay_ms: float) -> str:
    """What the stand-in's service time means for the c > 1 rows."""
    if delay_ms <= 0:
        return (
            "Nothing paces the load, so c > 1 measures saturation: the added latency there is "
            "queueing behind the gateway's CPU time per request, not the cost of one request."
        )
    return (
        f"Here every answer is held back {delay_ms:g} ms, so the c clients move in lockstep "
        "waves: each wave of c requests arrives at once and queues behind the gateway's CPU "
        "time per request (PaddleOCR's client sends pages in such bursts)."
    )


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    s, m = report["settings"], report["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["loadavg_at_start"] + m["loadavg_at_end"])
    modified = " (app/ modified since)" if m["app_modified_since_commit"] else ""
    return f"""# Gateway overhead, {report["date"]}

`{report["command"]}`

{latency_table(report["rows"])}

Milliseconds. *added* = gateway minus direct at the same percentile; target ≤ 1 ms p50 and
≤ 3 ms p99. The last column is the gateway's own `ocrvl_gateway_overhead_seconds` (latency minus
time waiting on the backend) over the measured gateway batches, with the share it put at or
under 1 ms.

{cpu_table(report["rows"])}

CPU is user + system time of all threads from `/proc/<pid>/stat` over the measured batches of
each path, in ms per request; *other processes* is the machine's busy time not used by these
three processes (other jobs on this shared machine), in cores.

- **Backend**: a stand-in for vLLM (`tests.support.fake_backend.FakeVLLM`, uvicorn + uvloop +
  httptools, own process) with near-zero service time, chosen so the gateway's cost is not
  buried in engine noise. {pacing(s["backend_delay_ms"])}
- **Gateway**: a real `ocrvl serve` subprocess, production defaults (`OCRVL_LOG_LEVEL=info`: the
  access line is part of the cost; stderr to a file, {report["access_lines"]} access lines).
- **Requests**: the body PaddleOCR's client sends (`bench.hey_body.build`) with a
  {s["image_bytes"] / 1024:.0f} KiB JPEG page, {s["body_bytes"] / 1024:.0f} KiB of JSON; model
  `{s["model"]}`, backend serves `{s["served"]}`; *stream* rows time the whole stream.
- **Load generator**: this script in its own process and event loop (uvloop), one keep-alive
  httpx client per target. Per mode and concurrency a warm-up batch per path, then batches of
  {batches(s["batches"])} (size x rounds), direct and gateway alternating ABBA.
- **Pinning**: {s["pinning"]}.
- **Machine**: {m["nproc"]} cores ({m["cpu"]}), {m["memory_gib"]} GiB, Python {m["python"]};
  load average at start and end {load}; commit `{m["git_commit"][:12]}`{modified}. Shared and
  noisy: p99 of ~200 samples is the 2nd-3rd slowest request, so compare runs before trusting it.
"""


# ------------------------------------------------------------------------------------ the main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per path (min)")
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[1, 32],
        help="comma-separated concurrency levels (default 1,32)",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=["json", "stream"],
        help="json (non-streaming), stream, or both (default json,stream)",
    )
    parser.add_argument("--pin", action="store_true", help="gateway on cpu 1, the rest on cpu 0")
    parser.add_argument(
        "--rewrite", action="store_true", help="serve another name: the gateway re-encodes bodies"
    )
    parser.add_argument(
        "--backend-delay-ms", type=float, default=0.0, help="stand-in service time (default 0)"
    )
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--served", default=MODEL, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build_report(
    args: argparse.Namespace, argv: list[str] | None, cells: list[Cell], facts: dict[str, Any]
) -> dict[str, Any]:
    """Settings, machine facts, the summary rows and the raw latencies, ready for JSON."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python -m bench.overhead", *(argv or sys.argv[1:])]),
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "modes": args.modes,
            "model": MODEL,
            "served": REWRITTEN if args.rewrite else MODEL,
            "backend_delay_ms": args.backend_delay_ms,
            "batches": [
                {"mode": c.mode, "concurrency": c.concurrency, "batch": c.batch, "rounds": c.rounds}
                for c in cells
            ],
            "pinning": "every thread: gateway on cpu 1; backend and load generator on cpu 0"
            if args.pin
            else "none (the kernel schedules the three processes over all cores)",
            "gateway_env": "OCRVL_LOG_LEVEL=info, every other OCRVL_* at its default",
        },
        "machine": facts | {"loadavg_at_end": os.getloadavg()},
        "rows": [summarize(cell) for cell in cells],
        "raw_latencies_ms": [
            {"mode": c.mode, "concurrency": c.concurrency}
            | {name: [round(v * 1000, 4) for v in c.latencies[name]] for name in TARGETS}
            for c in cells
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, write the markdown and JSON reports."""
    args = parse_args(argv)
    if args.serve_backend:
        serve_backend(args.serve_backend, args.served, args.backend_delay_ms / 1000)
        return 0
    image = document_page(seed=0)
    body = orjson.dumps(build(MODEL, 4096, seed=0))
    facts = machine()
    gc.collect()
    gc.freeze()  # the body and the imports stay out of the load generator's collections
    with tempfile.TemporaryDirectory(prefix="ocrvl-bench-") as workdir:
        with running(Path(workdir), args) as servers:
            print(f"backend {servers.backend}, gateway {servers.gateway}", file=sys.stderr)
            cells = uvloop.run(measure_all(servers, args, body))
        access_lines = servers.gateway_log.read_text().count('"msg":"request"')
    report = build_report(args, argv, cells, facts)
    report["settings"] |= {"image_bytes": len(image), "body_bytes": len(body)}
    report["access_lines"] = access_lines
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "-".join(filter(None, ["overhead", report["date"][:10], args.tag]))
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(report))
    print(latency_table(report["rows"]))
    print(cpu_table(report["rows"]))
    print(f"wrote {stem}.md and {stem}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
