"""vLLM's own view during a level: peaks of running and waiting requests and KV-cache usage.

Sampled from one or more `/metrics` URLs (one per engine; running and waiting are summed over
them at each sample, KV usage is the fullest engine's).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+|NaN)$", re.MULTILINE)
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, pre-0.10 name


@dataclass(slots=True)
class Peaks:
    """The highest values seen in a level's samples."""

    samples: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1


def parse(text: str) -> tuple[float, float, float] | None:
    """(running, waiting, KV usage) summed over the text's label sets; None without vLLM's."""
    found: dict[str, float] = {}
    for name, value in SAMPLE.findall(text):
        if name in (RUNNING, WAITING):
            found[name] = found.get(name, 0.0) + float(value)
        elif name in KV:
            found["kv"] = max(found.get("kv", 0.0), float(value))
    if RUNNING not in found:
        return None
    return found[RUNNING], found.get(WAITING, 0.0), found.get("kv", 0.0)


async def exposes_vllm(client: httpx.AsyncClient, url: str) -> bool:
    """Whether `url` answers with vLLM's metrics (vLLM itself does; the gateway does not)."""
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and parse(response.text) is not None


async def sample(client: httpx.AsyncClient, urls: list[str], interval: float, peaks: Peaks) -> None:
    """Poll `urls` every `interval` seconds into `peaks` until cancelled."""
    while True:
        replies = await asyncio.gather(*(client.get(u) for u in urls), return_exceptions=True)
        values = [
            parse(reply.text)
            for reply in replies
            if isinstance(reply, httpx.Response) and reply.status_code == 200
        ]
        seen = [v for v in values if v is not None]
        if seen:
            peaks.samples += 1
            peaks.running = max(peaks.running, sum(v[0] for v in seen))
            peaks.waiting = max(peaks.waiting, sum(v[1] for v in seen))
            peaks.kv_usage = max(peaks.kv_usage, *(v[2] for v in seen))
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def watching(
    client: httpx.AsyncClient, urls: list[str], interval: float
) -> AsyncIterator[Peaks | None]:
    """Sample `urls` while the block runs; yields None when there is nothing to sample."""
    if not urls:
        yield None
        return
    peaks = Peaks()
    task = asyncio.create_task(sample(client, urls, interval, peaks))
    try:
        yield peaks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
