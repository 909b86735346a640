"""Method 2 of the GPU passes (issue 50), pure: when a window starts and ends, its flatness
(bins' coefficient of variation), pages/s by count and by latency (Little's law), the A B B A
order, a variant's median window and the summary's shape. The rules in words, once: README.md,
"Method 2".
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

WINDOW_S = 120.0  # the least a window may last
LATENCIES = 10.0  # ... and the fewest mean latencies it must hold
BIN_S = 10.0  # completions are counted in bins this long
FLAT_CV = 0.15  # a window is flat when its bins' coefficient of variation is at most this
CANCELLED = "cancelled"  # a request still in flight when the load ended
# a window in the summary (issue 50 item 5):
WINDOW_KEYS = ("seconds", "mean_latencies", "pages_per_s_by_count", "pages_per_s_by_latency",
               "bins_cv")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Record:
    """One request (one page), seconds from the load's start."""

    worker: int
    start: float
    end: float
    status: str  # "200", another HTTP status, a transport error's name, or CANCELLED
    tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "200"

    @property
    def latency(self) -> float:
        return self.end - self.start


def ramp(concurrency: int, seconds: float) -> list[float]:
    """When each of `concurrency` clients starts: evenly over `seconds`."""
    return [seconds * index / concurrency for index in range(concurrency)]


def order(names: Sequence[str], windows: int) -> list[str]:
    """The variants' windows interleaved, each turn the last's reverse: A B B A A B ..."""
    turns: list[str] = []
    forward = list(names)
    for _ in range(windows):
        turns += forward
        forward.reverse()
    return turns


def window_start(records: Iterable[Record], concurrency: int, ramp_s: float) -> float | None:
    """After the ramp, once each of the C clients has had an answer; None while one has not."""
    first: dict[int, float] = {}
    for record in records:
        if record.status != CANCELLED:
            first[record.worker] = min(record.end, first.get(record.worker, math.inf))
    if len(first) < concurrency:
        return None
    return max(ramp_s, *first.values())


def window_end(
    records: Sequence[Record], start: float, now: float, *,
    window: float = WINDOW_S, latencies: float = LATENCIES,
) -> float | None:  # fmt: skip
    """`now`, once [start, now] lasts `window` seconds and `latencies` mean latencies of its own
    answers; None while not."""
    done = [r.latency for r in records if r.ok and start < r.end <= now]
    if not done or now - start < max(window, latencies * sum(done) / len(done)):
        return None
    return now


def bins(records: Iterable[Record], start: float, end: float, bin_s: float = BIN_S) -> list[int]:
    """Answers ended in each whole `bin_s` bin of (start, end] (a last partial bin dropped)."""
    count = int((end - start) // bin_s)
    counts = [0] * count
    for record in records:
        at = math.ceil((record.end - start) / bin_s) - 1
        if record.ok and 0 <= at < count:
            counts[at] += 1
    return counts


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population); inf for fewer than two bins or none answered."""
    if len(values) < 2 or not sum(values):
        return math.inf
    return statistics.pstdev(values) / statistics.fmean(values)


def in_flight(records: Iterable[Record], start: float, end: float) -> float:
    """The mean number of requests in flight over [start, end], from each one's span."""
    busy = sum(max(0.0, min(r.end, end) - max(r.start, start)) for r in records)
    return busy / (end - start)


def window(
    records: Sequence[Record], start: float, end: float, *,
    window_s: float = WINDOW_S, latencies: float = LATENCIES, bin_s: float = BIN_S,
) -> dict[str, Any]:  # fmt: skip
    """One window's figures: the summary's five (WINDOW_KEYS) and what a reader checks."""
    seconds = end - start
    ended = [r for r in records if start < r.end <= end and r.status != CANCELLED]
    lat = sorted(r.latency for r in ended if r.ok)
    mean = statistics.fmean(lat) if lat else math.inf
    counted = bins(records, start, end, bin_s)
    spread = cv(counted)
    held = seconds / mean
    return {
        "seconds": seconds,
        "mean_latencies": held,
        "pages_per_s_by_count": len(lat) / seconds,
        "pages_per_s_by_latency": in_flight(records, start, end) / mean,
        "bins_cv": spread,
        "span_s": [start, end],
        "answered": len(lat),
        "statuses": dict(sorted(Counter(r.status for r in ended).items())),
        "latency_s": {"mean": mean, "p50": lat[len(lat) // 2],
                      "p99": lat[int(0.99 * (len(lat) - 1))]} if lat else None,
        "bins": counted,
        "flat": spread <= FLAT_CV,
        "steady": seconds >= window_s - 1e-9 and held >= latencies,
    }  # fmt: skip


def median(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A variant's figure: its median window by count (the lower middle of an even number), and
    the spread of all its windows (min, max, (max - min) / median)."""
    ranked = sorted(windows, key=lambda w: w["pages_per_s_by_count"])
    middle = ranked[(len(ranked) - 1) // 2]
    low, high = ranked[0]["pages_per_s_by_count"], ranked[-1]["pages_per_s_by_count"]
    figure = middle["pages_per_s_by_count"]
    return {
        "pages_per_s_by_count": figure,
        "pages_per_s_by_latency": middle["pages_per_s_by_latency"],
        "window": windows.index(middle),
        "spread": {"min": low, "max": high, "relative": (high - low) / figure if figure else None},
        "all_flat": all(w["bins_cv"] <= FLAT_CV for w in windows),
        "all_steady": all(w.get("steady", True) for w in windows),
    }


def summary(
    gpu: str, floor: dict[str, Any], variants: Sequence[dict[str, Any]],
    layout_alone: float | None, raw: str,
) -> dict[str, Any]:  # fmt: skip
    """`bench/results/<pass>.json` exactly as issue 50 item 5 gives it: each variant's `name`,
    `stack`, `concurrency`, `floor_ms_per_page` and windows of WINDOW_KEYS."""
    return {
        "method": 2,
        "gpu": gpu,
        "floor": {"ms_per_page": floor["ms_per_page"], "definition": floor["definition"]},
        "variants": [
            {
                "name": v["name"],
                "stack": v["stack"],
                "concurrency": v["concurrency"],
                "floor_ms_per_page": v["floor_ms_per_page"],
                "windows": [{key: w[key] for key in WINDOW_KEYS} for w in v["windows"]],
            }
            for v in variants
        ],
        "layout_service_alone_pages_per_s": layout_alone,
        "raw": raw,
    }


def of_floor(pages_per_s: float, floor_ms_per_page: float) -> float:
    """A figure as a fraction of its floor: pages/s x floor ms per page / 1000."""
    return pages_per_s * floor_ms_per_page / 1000.0
