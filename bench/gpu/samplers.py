"""What `bench.gpu.steady` records beside the requests: /metrics texts and nvidia-smi samples.

Both are written raw (seconds from the load's start on every line) and summarised over a
window: vLLM's running/waiting requests, its finished-request counter and where a page's time
went (`app.bench.engine`'s phases, the gateway's too when its /metrics is among the URLs), and
the GPU's utilisation and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import httpx
import orjson

from app.bench import engine

# vLLM's and the gateway's samples without histogram buckets (phases need sums and counts); the
# layout service's with them (its batch-size histogram is what it formed under the load)
KEEP = re.compile(
    r"^(?:ocrvl_layout[^\s{]*|(?:vllm:|ocrvl_)[^\s{]*(?<!_bucket)(?<!_created))(?:\{[^}]*\})? "
)
SUCCESS = re.compile(r"^vllm:request_success_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)
GPU_QUERY = "timestamp,index,utilization.gpu,memory.used"
APPS_QUERY = "timestamp,pid,process_name,used_memory"  # each process's memory on the GPU


def kept(text: str) -> str:
    """The lines of a /metrics text worth keeping (KEEP)."""
    return "\n".join(line for line in text.splitlines() if KEEP.match(line + " "))


async def metrics(
    client: httpx.AsyncClient, urls: list[str], interval: float, began: float, out: IO[bytes]
) -> None:
    """Every `interval` s until cancelled: each URL's kept lines, one JSON line per sample."""
    while True:
        replies = await asyncio.gather(*(client.get(u) for u in urls), return_exceptions=True)
        at = time.perf_counter() - began
        texts = [kept(r.text) if isinstance(r, httpx.Response) and r.status_code == 200 else None
                 for r in replies]  # fmt: skip
        out.write(orjson.dumps({"t": round(at, 3), "texts": dict(zip(urls, texts, strict=True))}))
        out.write(b"\n")
        out.flush()
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def sampling(
    urls: list[str], interval: float, began: float, path: Path
) -> AsyncIterator[None]:
    """`metrics` into `path` while the block runs (nothing when there are no URLs)."""
    if not urls:
        yield
        return
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        with path.open("wb") as out:
            task = asyncio.create_task(metrics(client, urls, interval, began, out))
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def engine_window(path: Path, start: float, end: float) -> dict[str, Any] | None:
    """From a metrics file: vLLM's finished requests per second, mean running/waiting and the
    phases' mean seconds per page over [start, end]; None without samples."""
    if not path.exists():
        return None
    samples = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    timeline, loads, success = [], [], []
    for sample in samples:
        texts = list(sample["texts"].values())
        if any(text is None for text in texts):
            continue  # a URL that did not answer: its totals would jump
        joined = "\n".join(texts)
        timeline.append((sample["t"], engine.totals(joined)))
        if start <= sample["t"] <= end and (seen := engine.parse(joined)) is not None:
            loads.append(seen)
        success.append((sample["t"], sum(float(v) for v in SUCCESS.findall(joined))))
    inside = [(t, n) for t, n in success if start <= t <= end]
    rate = ((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
            if len(inside) > 1 and inside[-1][0] > inside[0][0] else None)  # fmt: skip
    return {
        "samples": len(loads),
        # vLLM's own count: a third reading beside the two of the load (none without vLLM)
        "finished_per_s": rate if loads else None,
        "running_mean": sum(s[0] for s in loads) / len(loads) if loads else None,
        "waiting_mean": sum(s[1] for s in loads) / len(loads) if loads else None,
        "kv_usage_max": max((s[2] for s in loads), default=None),
        "phases": engine.phases(timeline, start, end),
    }


@contextlib.contextmanager
def gpu(path: Path, apps: Path | None = None) -> Iterator[bool]:
    """nvidia-smi every second into `path` (and each compute process's memory into `apps`)
    while the block runs; yields whether it runs."""
    if shutil.which("nvidia-smi") is None:  # no GPU (the CPU rehearsal)
        yield False
        return
    queries = [(path, f"--query-gpu={GPU_QUERY}")]
    if apps is not None:
        queries.append((apps, f"--query-compute-apps={APPS_QUERY}"))
    processes = []
    for file, query in queries:
        with file.open("wb") as out:
            processes.append(subprocess.Popen(
                ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "1000"],
                stdout=out, stderr=subprocess.DEVNULL))  # fmt: skip
    try:
        yield True
    finally:
        for process in processes:
            process.terminate()
            process.wait()


def apps_window(path: Path, began_epoch: float, start: float, end: float) -> dict[str, Any] | None:
    """Each GPU process's memory (MiB) over [start, end] from nvidia-smi's compute-apps rows:
    its name, the first, the last and the most seen; None without rows."""
    if not path.exists():
        return None
    seen: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 4 or not cells[3].isdigit():
            continue
        try:
            stamp = datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        if not start <= stamp - began_epoch <= end:
            continue
        mib = float(cells[3])
        one = seen.setdefault(cells[1], {"name": cells[2], "samples": 0, "first_mib": mib})
        one["samples"] += 1
        one["last_mib"] = mib
        one["max_mib"] = max(one.get("max_mib", mib), mib)
    return seen or None


def gpu_window(path: Path, began_epoch: float, start: float, end: float) -> dict[str, Any] | None:
    """Mean and max utilisation (%) and max memory (MiB) per GPU over [start, end], from
    nvidia-smi's rows (its timestamps against the load's start, `began_epoch`)."""
    if not path.exists():
        return None
    per_gpu: dict[str, list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 4 or not cells[2].isdigit():
            continue
        stamp = datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        if start <= stamp - began_epoch <= end:
            per_gpu.setdefault(cells[1], []).append((float(cells[2]), float(cells[3])))
    if not per_gpu:
        return None
    return {
        index: {"samples": len(rows), "busy_mean_pct": sum(r[0] for r in rows) / len(rows),
                "busy_max_pct": max(r[0] for r in rows),
                "memory_max_mib": max(r[1] for r in rows)}
        for index, rows in per_gpu.items()
    }  # fmt: skip


LAYOUT = re.compile(
    r'^(ocrvl_layout_[a-z_]+?)(?:_bucket\{le="([^"]+)"\}|_(sum|count))? ([0-9.eE+-]+)$'
)


MEMORY = re.compile(r'^ocrvl_layout_gpu_memory_bytes\{kind="([a-z_]+)"\} ([0-9.eE+-]+)$')
MEMORY_KINDS = ("allocated", "max_allocated", "reserved", "max_reserved")


def _layout_values(text: str) -> dict[str, float]:
    """The layout service's histogram sums, counts and buckets, and its GPU memory gauges, as
    flat keys."""
    values = {}
    for line in text.splitlines():
        if match := LAYOUT.match(line):
            name, le, part, value = match.groups()
            values[f"{name}:{le or part or ''}"] = float(value)
        elif match := MEMORY.match(line):
            values[f"ocrvl_layout_gpu_memory_bytes:{match[1]}"] = float(match[2])
    return values


def layout_window(path: Path, start: float, end: float) -> dict[str, Any] | None:
    """The layout service's own account of [start, end] (the samples bracketing it): forward
    passes and pages, the mean batch it formed and how many batches of each size, forward ms per
    page, queue wait; None without its metrics."""
    if not path.exists():
        return None
    samples = []
    for raw in path.read_bytes().splitlines():
        sample = orjson.loads(raw)
        texts = [t for t in sample["texts"].values() if t and "ocrvl_layout_" in t]
        if texts:
            samples.append((sample["t"], _layout_values(texts[0])))
    before = [s for s in samples if s[0] <= start] or samples[:1]
    until = [s for s in samples if s[0] <= end]
    if not before or not until or until[-1][0] <= before[-1][0]:
        return None
    first, last = before[-1][1], until[-1][1]

    def delta(key: str) -> float:
        return last.get(key, 0.0) - first.get(key, 0.0)

    passes, pages = delta("ocrvl_layout_batch_size:count"), delta("ocrvl_layout_batch_size:sum")
    buckets = sorted((float(k.split(":")[1]), k) for k in last
                     if k.startswith("ocrvl_layout_batch_size:") and k[-1].isdigit())  # fmt: skip
    cumulative = [(le, delta(key)) for le, key in buckets]
    histogram = {f"<= {le:g}": n - (cumulative[i - 1][1] if i else 0.0)
                 for i, (le, n) in enumerate(cumulative)}  # fmt: skip
    waits = delta("ocrvl_layout_queue_wait_seconds:count")
    memory = [s[1] for s in samples if start <= s[0] <= end]
    return {
        "seconds": until[-1][0] - before[-1][0],
        "forward_passes": passes,
        "pages": pages,
        "mean_batch": pages / passes if passes else None,
        "batches_by_size": histogram,
        "forward_ms_per_page": 1000 * delta("ocrvl_layout_forward_seconds:sum") / pages
        if pages
        else None,
        "queue_wait_ms_mean": 1000 * delta("ocrvl_layout_queue_wait_seconds:sum") / waits
        if waits
        else None,
        # torch's own account of the service's GPU memory (ocrvl_layout_gpu_memory_bytes), the
        # most seen over the window: allocated, max_allocated, reserved, max_reserved (MiB)
        "torch_memory_mib": {
            kind: max(m[key] for m in memory if key in m) / 2**20
            for kind in MEMORY_KINDS
            if any((key := f"ocrvl_layout_gpu_memory_bytes:{kind}") in m for m in memory)
        }
        or None,
    }
