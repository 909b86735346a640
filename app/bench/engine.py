"""vLLM's own view during a level: peaks of running and waiting requests and KV-cache usage,
and where a page's time went.

Sampled from one or more `/metrics` URLs (one per engine; running and waiting are summed over
them at each sample, KV usage is the fullest engine's). Each sample also keeps the sums and
counts of the latency histograms of vLLM and of the gateway (when its `/metrics` is among the
URLs), so the mean time a page spent in each phase over the measured window is the change of
sum over the change of count between the samples that bracket it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+|NaN)$", re.MULTILINE)
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, pre-0.10 name
HISTOGRAM = re.compile(
    r"^((?:vllm:|ocrvl_)[a-z0-9_]+)_(sum|count)(?:\{([^}]*)\})? ([0-9.eE+-]+)$", re.MULTILINE
)
CHAT_ROUTE = 'route="/v1/chat/completions"'
PHASES = {
    # the gateway: a request from its arrival to its answer, and its wait for a backend slot
    "gateway": "ocrvl_request_duration_seconds",
    "gateway_queue": "ocrvl_queue_wait_seconds",
    # vLLM, from the start of rendering (chat template, image decode, the HF processor) to the
    # last token; its engine queue, prefill (the vision encoder included) and decode
    "vllm": "vllm:e2e_request_latency_seconds",
    "engine_queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
Totals = dict[str, tuple[float, float]]  # phase: (sum of seconds, count)


@dataclass(slots=True)
class Peaks:
    """The highest values seen in a level's samples."""

    samples: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    # (time.perf_counter(), the phases' histogram totals) per sample that had any
    timeline: list[tuple[float, Totals]] = field(default_factory=list)


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


def totals(text: str) -> Totals:
    """Each phase's histogram (sum, count), summed over label sets; the gateway's only for
    its chat route. Phases the text lacks are left out."""
    names = {metric: phase for phase, metric in PHASES.items()}
    found: dict[str, list[float]] = {}
    for metric, kind, labels, value in HISTOGRAM.findall(text):
        phase = names.get(metric)
        if phase is None:
            continue
        if metric.startswith("ocrvl_") and "route=" in labels and CHAT_ROUTE not in labels:
            continue  # the gateway's other routes: /metrics, /health, /v1/ocr
        found.setdefault(phase, [0.0, 0.0])[kind == "count"] += float(value)
    return {phase: (pair[0], pair[1]) for phase, pair in found.items()}


def phases(timeline: list[tuple[float, Totals]], start: float, end: float) -> dict[str, Any]:
    """Mean seconds per request in each phase between the last samples at or before `start`
    and `end` (the first sample stands in for a start before it), with the requests counted;
    empty when fewer than two samples bracket the window."""
    before = [entry for entry in timeline if entry[0] <= start] or timeline[:1]
    until = [entry for entry in timeline if entry[0] <= end]
    if not before or not until or until[-1][0] <= before[-1][0]:
        return {}
    (t0, first), (t1, last) = before[-1], until[-1]
    means, counts = {}, {}
    for phase, (total, count) in last.items():
        done = count - first.get(phase, (0.0, 0.0))[1]
        if done > 0:
            means[phase] = (total - first.get(phase, (0.0, 0.0))[0]) / done
            counts[phase] = int(done)
    if counts.get("gateway"):
        # the gateway times only the requests that waited for a slot: per page, the wait is
        # theirs spread over every request it answered (0 when none waited)
        waited = last.get("gateway_queue", (0.0, 0.0))[0] - first.get("gateway_queue", (0, 0))[0]
        means["gateway_queue"] = waited / counts["gateway"]
        counts["gateway_queue"] = counts.get("gateway_queue", 0)  # how many waited
    if not means:
        return {}
    return {"mean_s": means, "requests": counts, "from_s": t0 - start, "to_s": t1 - end}


async def exposes_gateway(client: httpx.AsyncClient, url: str) -> bool:
    """Whether `url` answers with the gateway's metrics (its request-duration histogram)."""
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return False
    # its TYPE line is there before the first chat request has been timed
    return response.status_code == 200 and f"# TYPE {PHASES['gateway']} " in response.text


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
        answered = [r for r in replies if isinstance(r, httpx.Response) and r.status_code == 200]
        if len(answered) == len(urls):  # a sum over some of the URLs would jump
            merged: Totals = {}
            for reply in answered:
                for phase, (total, count) in totals(reply.text).items():
                    before = merged.get(phase, (0.0, 0.0))
                    merged[phase] = (before[0] + total, before[1] + count)
            if merged:
                peaks.timeline.append((time.perf_counter(), merged))
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
