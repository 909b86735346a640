"""A level's numbers: counts by status, throughput, latency and TTFT quantiles, engine peaks
and where a page's time went."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from app.bench.engine import Peaks, phases
from app.bench.load import LevelRun

SHED = {429: "rate_limited", 503: "unavailable"}  # shedding, counted apart from failures


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values`, linearly interpolated between the closest ranks."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: list[float]) -> dict[str, float] | None:
    """avg, p50, p90, p99 and max in seconds; None when there are no values."""
    if not values:
        return None
    summary = {"avg": sum(values) / len(values)}
    summary |= {f"p{round(q * 100)}": quantile(values, q) for q in (0.5, 0.9, 0.99)}
    return summary | {"max": max(values)}


def summarize(run: LevelRun, concurrency: int, peaks: Peaks | None) -> dict[str, Any]:
    """The level as the report stores it (seconds, pages and tokens per second)."""
    statuses = Counter(str(o.status) for o in run.outcomes)
    ok = [o for o in run.outcomes if o.ok]
    seconds = max(run.ended - run.started, 1e-9)
    errors = {status: n for status, n in sorted(statuses.items()) if status != "200"}
    shed = {name: statuses.get(str(code), 0) for code, name in SHED.items()}
    failed = sum(errors.values()) - sum(shed.values())
    first_error = next((o for o in run.outcomes if not o.ok), None)
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    return {
        "concurrency": concurrency,
        "requests": len(run.outcomes),
        "ok": len(ok),
        "errors": errors,
        **shed,
        "failed": failed,
        "error_rate": (len(run.outcomes) - len(ok)) / len(run.outcomes) if run.outcomes else 0.0,
        "first_error": (
            {"status": first_error.status, "message": first_error.message} if first_error else None
        ),
        "seconds": seconds,
        "ended_by": run.ended_by,
        "pages_per_s": len(ok) / seconds,
        # Little's law for a closed loop (C always in flight): a rate that does not depend on
        # how completions happen to fall into a short window
        "closed_loop_pages_per_s": concurrency / (sum(o.end - o.start for o in ok) / len(ok))
        if ok
        else 0.0,
        "output_tokens_per_s": sum(o.tokens for o in ok) / seconds,
        "output_tokens_avg": sum(o.tokens for o in ok) / len(ok) if ok else 0.0,
        "latency_s": spread([o.end - o.start for o in ok]),
        "ttft_s": spread(ttfts),
        "engine": (
            {
                "samples": peaks.samples,
                "running_max": peaks.running,
                "waiting_max": peaks.waiting,
                "kv_usage_max": peaks.kv_usage,
            }
            if peaks and peaks.samples
            else None
        ),
        # mean seconds per page in the gateway's and vLLM's phases over the window
        "phases": phases(peaks.timeline, run.started, run.ended) if peaks else {},
        "load_generator": {
            "cpu_seconds": run.cpu_seconds,
            # cores busy per 100 requests/s, in % of one core (budget: 10 %)
            "cpu_percent_per_100_rps": run.cpu_seconds / len(run.outcomes) * 1e4
            if run.outcomes
            else 0.0,
            # how late its event loop ran (seconds past each 50 ms tick)
            "loop_lag_s": spread(run.loop_lags),
        },
    }
