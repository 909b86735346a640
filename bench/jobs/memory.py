"""Gateway memory while a long PDF job runs: RSS against the pages in flight, not the pages.

A stand-in backend (bench.overhead's, each answer held back `delay_ms`) and a real `ocrvl serve`
with its job store in a temporary data dir. For each page count, a fresh gateway gets one job of
that many small blank PDF pages (rendering cost is not the question); the gateway's RSS (and its
page workers', summed) is sampled every 10 ms from submit to the job's end. Flat peak RSS across
page counts means the job holds only its pages in flight.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.memory.__main__ import Sampler, rss
from bench.overhead import BACKEND_KEY, CLIENT_KEY, MODEL
from bench.overhead.processes import VENV_BIN, spawn, stop, wait_ready
from tests.support.documents import blank_pdf
from tests.support.servers import free_port

MB = 1024 * 1024


def children_rss(pid: int) -> int:
    """RSS of `pid`'s child processes (the page workers), summed."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in children:
            with contextlib.suppress(FileNotFoundError, RuntimeError):
                total += rss(int(child))
    return total


@contextlib.contextmanager
def stack(workdir: Path, delay_ms: float, **env: str) -> Iterator[tuple[str, int]]:
    """The stand-in backend and a gateway with a job store in `workdir`; (gateway URL, pid)."""
    ports = {"backend": free_port(), "gateway": free_port()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    backend = [sys.executable, "-m", "bench.overhead", "--serve-backend", str(ports["backend"])]
    backend += ["--served", MODEL, "--backend-delay-ms", str(delay_ms), "--chunk-interval-ms", "0"]
    gateway = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    gateway += ["--port", str(ports["gateway"])]
    gateway_env = {
        **clean,
        "OCRVL_BACKENDS": f"http://127.0.0.1:{ports['backend']}",
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_DATA_DIR": str(workdir / "data"),
        "OCRVL_JOB_MAX_PAGES": "100000",
        **env,
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command, environment, probe in (
            ("backend", backend, clean, "/health"),
            ("gateway", gateway, gateway_env, "/ready"),
        ):
            process = spawn(command, workdir / f"{name}.log", environment)
            processes.append(process)
            wait_ready(f"http://127.0.0.1:{ports[name]}{probe}", process, workdir / f"{name}.log")
        yield f"http://127.0.0.1:{ports['gateway']}", processes[-1].pid
    finally:
        for process in reversed(processes):
            stop(process)


def one_job(url: str, document: bytes, timeout: float) -> dict[str, Any]:
    """Submit `document` as a job and poll it to its end; the ended job."""
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        submitted = http.post("/v1/ocr/jobs", files={"file": ("doc.pdf", document)})
        submitted.raise_for_status()
        job: dict[str, Any] = submitted.json()
        deadline = time.monotonic() + timeout
        while job["status"] in ("queued", "running") and time.monotonic() < deadline:
            job = http.get(f"/v1/ocr/jobs/{job['id']}", params={"wait": "5"}).json()
            time.sleep(0.5)
    return job


def measure(page_counts: list[int], delay_ms: float, concurrency: int) -> list[dict[str, Any]]:
    """One row per page count, each in a fresh gateway."""
    rows = []
    for pages in page_counts:
        document = blank_pdf(pages)
        with (
            tempfile.TemporaryDirectory() as workdir,
            stack(Path(workdir), delay_ms, OCRVL_JOB_PAGE_CONCURRENCY=str(concurrency)) as (
                url,
                pid,
            ),
        ):
            one_job(url, blank_pdf(2), 60)  # warm: the page workers, the first connection
            time.sleep(1)
            idle, workers_idle = rss(pid), children_rss(pid)
            started = time.monotonic()
            with Sampler(pid) as sampler:
                job = one_job(url, document, 3600)
                peak = sampler.peak
            seconds = time.monotonic() - started
            workers_after = children_rss(pid)
        rows.append(
            {
                "pages": pages,
                "document_bytes": len(document),
                "page_concurrency": concurrency,
                "status": job["status"],
                "pages_done": job["pages_done"],
                "seconds": round(seconds, 1),
                "idle_rss": idle,
                "peak_rss": peak,
                "peak_over_idle": peak - idle,
                "workers_rss_idle": workers_idle,
                "workers_rss_after": workers_after,
            }
        )
        print(
            f"{pages:>6} pages  {job['status']:<10} {seconds:7.1f} s  idle {idle / MB:6.1f} MB  "
            f"peak {peak / MB:6.1f} MB  (+{(peak - idle) / MB:5.1f} MB)  "
            f"workers {workers_idle / MB:6.1f} -> {workers_after / MB:6.1f} MB",
            flush=True,
        )
    return rows
