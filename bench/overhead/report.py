"""The report: quantiles and summaries of the cells, markdown tables, the .md and .json files."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
from collections.abc import Iterable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from app.bench.stats import quantile
from bench.overhead import MODEL, PROCESSES, ROOT, TARGET_P50, TARGET_P99, TARGETS
from bench.overhead.load import Cell

PACKAGES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "httpx", "httpcore", "orjson")


def _path(cell: Cell, name: str) -> dict[str, Any]:
    """One path's latencies in ms, throughput, CPU in ms per request and others' load in cores."""
    values, seconds, cpu = cell.latencies[name], cell.seconds[name], cell.cpu[name]
    return {
        "n": len(values),
        "p50_ms": quantile(values, 0.5) * 1000,
        "p99_ms": quantile(values, 0.99) * 1000,
        "mean_ms": sum(values) / len(values) * 1000,
        "requests_per_s": len(values) / seconds,
        "cpu_ms_per_request": {p: cpu[p] / len(values) * 1000 for p in PROCESSES if p != "others"},
        "other_processes_cores": cpu["others"] / seconds,
    }


def summarize(cell: Cell) -> dict[str, Any]:
    """The cell's numbers: both paths, the added latency and the gateway's own view of it."""
    row: dict[str, Any] = {"mode": cell.mode, "concurrency": cell.concurrency}
    row["chunks"] = cell.chunks
    row |= {name: _path(cell, name) for name in TARGETS}
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


def _slope(few: dict[str, Any], many: dict[str, Any], path: str, process: str) -> float:
    """µs of `process` CPU per extra chunk on `path` between two sse rows."""
    used = [r[path]["cpu_ms_per_request"][process] for r in (few, many)]
    return float(used[1] - used[0]) / (many["chunks"] - few["chunks"]) * 1000


def chunk_costs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU per relayed SSE chunk at each concurrency: the slope of CPU per request between the
    sse cells with the fewest and the most chunks, for the gateway and for the stand-in (the
    backend on the direct path: the yardstick)."""
    costs = []
    for concurrency in dict.fromkeys(r["concurrency"] for r in rows):
        sse = sorted(
            (r for r in rows if r["mode"] == "sse" and r["concurrency"] == concurrency),
            key=lambda r: r["chunks"],
        )
        if len(sse) < 2 or sse[0]["chunks"] == sse[-1]["chunks"]:
            continue
        few, many = sse[0], sse[-1]
        costs.append(
            {
                "concurrency": concurrency,
                "chunks": [few["chunks"], many["chunks"]],
                "gateway_us_per_chunk": _slope(few, many, "gateway", "gateway"),
                "backend_us_per_chunk": _slope(few, many, "direct", "backend"),
                "gateway_ms_per_request": [
                    r["gateway"]["cpu_ms_per_request"]["gateway"] for r in (few, many)
                ],
            }
        )
    return costs


def _mode(row: dict[str, Any]) -> str:
    """The row's mode as the tables show it: `sse` with its chunk count."""
    return f"sse x{row['chunks']}" if row["chunks"] else str(row["mode"])


def _table(header: list[str], align: str, rows: Iterable[list[str]]) -> str:
    """A markdown table; `align` has an `l` or `r` per column."""
    rule = "|".join("---" if a == "l" else "--:" for a in align)
    lines = [f"| {' | '.join(header)} |", f"|{rule}|"]
    lines += [f"| {' | '.join(cells)} |" for cells in rows]
    return "\n".join(lines)


def latency_table(rows: list[dict[str, Any]]) -> str:
    """Latencies and the added latency as a markdown table."""
    header = ["mode", "c", "n each", "direct p50", "direct p99", "gateway p50", "gateway p99"]
    header += ["**added p50**", "**added p99**", "target", "gateway self-measured mean (≤1 ms)"]
    cells = []
    for r in rows:
        direct, gateway, added = r["direct"], r["gateway"], r["added"]
        own = r["gateway_self_measured"]
        cells.append(
            [
                _mode(r),
                str(r["concurrency"]),
                str(direct["n"]),
                *(f"{path[p]:.2f}" for path in (direct, gateway) for p in ("p50_ms", "p99_ms")),
                f"**{added['p50_ms']:+.2f}**",
                f"**{added['p99_ms']:+.2f}**",
                "meets" if added["meets_target"] else "misses",
                f"{own['mean_ms']:.2f} ({own['share_at_or_under_1ms']:.0%})",
            ]
        )
    return _table(header, "lrrrrrrrrlr", cells)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    """Throughput and CPU time per request of each process as a markdown table."""
    header = ["mode", "c", "direct req/s", "gateway req/s", "backend CPU/req"]
    header += ["**gateway CPU/req**", "load generator CPU/req (direct, gateway)"]
    header += ["other processes, cores (direct, gateway)"]
    cells = []
    for r in rows:
        direct, gateway = r["direct"], r["gateway"]
        load = [path["cpu_ms_per_request"]["load_generator"] for path in (direct, gateway)]
        # tick-based accounting puts small negative noise on an idle machine: show it as 0
        others = [max(path["other_processes_cores"], 0) for path in (direct, gateway)]
        cells.append(
            [
                _mode(r),
                str(r["concurrency"]),
                f"{direct['requests_per_s']:.0f}",
                f"{gateway['requests_per_s']:.0f}",
                f"{direct['cpu_ms_per_request']['backend']:.2f}",
                f"**{gateway['cpu_ms_per_request']['gateway']:.2f}**",
                f"{load[0]:.2f}, {load[1]:.2f}",
                f"{others[0]:.2f}, {others[1]:.2f}",
            ]
        )
    return _table(header, "lrrrrrrr", cells)


def chunk_table(costs: list[dict[str, Any]]) -> str:
    """CPU per relayed SSE chunk as a markdown table."""
    header = ["c", "chunks", "gateway CPU/req (few, many)", "**gateway µs/chunk**"]
    header += ["backend µs/chunk"]
    cells = [
        [
            str(c["concurrency"]),
            f"{c['chunks'][0]} → {c['chunks'][1]}",
            ", ".join(f"{ms:.2f}" for ms in c["gateway_ms_per_request"]),
            f"**{c['gateway_us_per_chunk']:.1f}**",
            f"{c['backend_us_per_chunk']:.1f}",
        ]
        for c in costs
    ]
    return _table(header, "lrrrr", cells)


def _spacing(interval_ms: float) -> str:
    """How the stand-in spaced its chunks."""
    if interval_ms <= 0:
        return "back to back"
    return f"{interval_ms:g} ms apart (each chunk also costs every process a wake-up)"


def _chunks_section(report: dict[str, Any]) -> str:
    """The markdown about the per-chunk cost, or nothing when no sse cells were measured."""
    if not report["chunk_costs"]:
        return ""
    s = report["settings"]
    return f"""
{chunk_table(report["chunk_costs"])}

CPU per relayed SSE chunk: the slope of CPU per request between the *sse* cells (the stand-in
streams exactly that many one-token chunks of ~200 bytes, {_spacing(s["chunk_interval_ms"])},
the last with finish_reason "length", then `[DONE]`; the gateway hands on what has arrived by
the time it asks as one send); the backend's own slope on the direct path beside it. Target
≤ 20 µs per chunk.
"""


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
    """The batch plan per mode and concurrency, e.g. `json c=1: 125x8, json c=32: 125x8`."""
    plan = {f"{c['mode']} c={c['concurrency']}": f"{c['batch']}x{c['rounds']}" for c in cells}
    return ", ".join(f"{cell}: {p}" for cell, p in plan.items())


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
{_chunks_section(report)}
CPU is user + system time of all threads (`/proc/<pid>/task/*/schedstat`, to the nanosecond)
over the measured batches of each path, in ms per request; *other processes* is the machine's
busy time not used by these three processes (other jobs on this shared machine), in cores.

- **Backend**: a stand-in for vLLM (`tests.support.fake_backend.FakeVLLM`, uvicorn + uvloop +
  httptools, own process) with near-zero service time, chosen so the gateway's cost is not
  buried in engine noise. {pacing(s["backend_delay_ms"])}
- **Gateway**: a real `ocrvl serve` subprocess, production defaults (`OCRVL_LOG_LEVEL=info`: the
  access line is part of the cost; stderr to a file, {report["access_lines"]} access lines).
- **Requests**: the body PaddleOCR's client sends (`bench.hey_body.build`) with a
  {s["image_bytes"] / 1024:.0f} KiB JPEG page, {s["body_bytes"] / 1024:.0f} KiB of JSON; model
  `{s["model"]}`, backend serves `{s["served"]}`; *stream* and *sse* rows time the whole
  stream.
- **Load generator**: this script in its own process and event loop (uvloop), one keep-alive
  httpx client per target. Per mode and concurrency a warm-up batch per path, then batches of
  {batches(s["batches"])} (size x rounds), direct and gateway alternating ABBA.
- **Pinning**: {s["pinning"]}.
- **Machine**: {m["nproc"]} cores ({m["cpu"]}), {m["memory_gib"]} GiB, Python {m["python"]};
  load average at start and end {load}; commit `{m["git_commit"][:12]}`{modified}. Shared and
  noisy: p99 of ~200 samples is the 2nd-3rd slowest request, so compare runs before trusting it.
"""


def build_report(
    args: argparse.Namespace,
    cells: list[Cell],
    facts: dict[str, Any],
    *,
    command: str,
    served: str,
    sizes: dict[str, int],
    access_lines: int,
) -> dict[str, Any]:
    """Settings, machine facts, the summary rows and the raw latencies, ready for JSON."""
    rows = [summarize(cell) for cell in cells]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "modes": args.modes,
            "model": MODEL,
            "served": served,
            "backend_delay_ms": args.backend_delay_ms,
            "chunks": args.chunks,
            "sse_requests": args.sse_requests,
            "chunk_interval_ms": args.chunk_interval_ms,
            "batches": [
                {
                    "mode": c.mode,
                    "chunks": c.chunks,
                    "concurrency": c.concurrency,
                    "batch": c.batch,
                    "rounds": c.rounds,
                }
                for c in cells
            ],
            "pinning": "every thread: gateway on cpu 1; backend and load generator on cpu 0"
            if args.pin
            else "none (the kernel schedules the three processes over all cores)",
            "gateway_env": "OCRVL_LOG_LEVEL=info, every other OCRVL_* at its default",
        }
        | sizes,
        "machine": facts | {"loadavg_at_end": os.getloadavg()},
        "rows": rows,
        "chunk_costs": chunk_costs(rows),
        "raw_latencies_ms": [
            {"mode": c.mode, "concurrency": c.concurrency, "chunks": c.chunks}
            | {name: [round(v * 1000, 4) for v in c.latencies[name]] for name in TARGETS}
            for c in cells
        ],
        "access_lines": access_lines,
    }


def write(report: dict[str, Any], out: Path, tag: str) -> Path:
    """Write the report as `out/overhead-<date>[-tag].json` and `.md`; the path without suffix."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / "-".join(filter(None, ["overhead", report["date"][:10], tag]))
    Path(f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(report))
    return stem
