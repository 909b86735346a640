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
# The gateway times the queue wait only of requests that waited for a slot: per page, their
# wait is spread over every request the gateway answered (0 when none waited)
PER_PAGE_OF = {"gateway_queue": "gateway"}
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
    and `end` (the first sample stands in for a start before it), with the requests each
    histogram counted; empty when fewer than two samples bracket the window."""
    before = [entry for entry in timeline if entry[0] <= start] or timeline[:1]
    until = [entry for entry in timeline if entry[0] <= end]
    if not before or not until or until[-1][0] <= before[-1][0]:
        return {}
    (t0, first), (t1, last) = before[-1], until[-1]

    def change(phase: str) -> tuple[float, float]:
        total, count = last.get(phase, (0.0, 0.0))
        was_total, was_count = first.get(phase, (0.0, 0.0))
        return total - was_total, count - was_count

    means, counts = {}, {}
    for phase in last:
        total, done = change(phase)
        per = change(PER_PAGE_OF.get(phase, phase))[1]
        if per > 0:
            means[phase], counts[phase] = total / per, int(done)
    if not means:
        return {}
    return {"mean_s": means, "requests": counts, "from_s": t0 - start, "to_s": t1 - end}


async def metrics_of(client: httpx.AsyncClient, url: str) -> str | None:
    """Whose metrics `url` answers with: "vllm" (vLLM's load gauges), "gateway" (its
    request-duration histogram, whose TYPE line is there before the first chat request has been
    timed) or None."""
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    if parse(response.text) is not None:
        return "vllm"
    return "gateway" if f"# TYPE {PHASES['gateway']} " in response.text else None


async def sample(client: httpx.AsyncClient, urls: list[str], interval: float, peaks: Peaks) -> None:
    """Poll `urls` every `interval` seconds into `peaks` until cancelled. The texts are read
    as one: parse and totals already sum (KV: take the fullest) over label sets, so over
    engines too."""
    while True:
        replies = await asyncio.gather(*(client.get(u) for u in urls), return_exceptions=True)
        texts = [r.text for r in replies if isinstance(r, httpx.Response) and r.status_code == 200]
        joined = "\n".join(texts)
        # histogram totals only when every URL answered: a sum over some of them would jump
        if len(texts) == len(urls) and (merged := totals(joined)):
            peaks.timeline.append((time.perf_counter(), merged))
        seen = parse(joined)
        if seen is not None:
            peaks.samples += 1
            peaks.running = max(peaks.running, seen[0])
            peaks.waiting = max(peaks.waiting, seen[1])
            peaks.kv_usage = max(peaks.kv_usage, seen[2])
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
