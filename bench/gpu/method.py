"""The measuring method of the GPU passes (issue 37): arrivals, steady windows and pages/s.

Pure functions over request records, so that the load generator (`bench.gpu.steady`) decides a
window online with the same rules a reader applies to its raw file afterwards:

- **Arrivals.** Closed loop: C clients whose starts are spread evenly over a ramp (no lock-step
  waves of equal-length requests). Open loop: Poisson arrivals at a set rate, seeded.
- **The steady window** starts once the ramp is over and every client has finished one request
  (closed), or after `settle` mean latencies (open), and ends no earlier than `window` seconds and
  `latencies` mean latencies later. A window that could not meet both is marked not steady.
- **Pages/s, two ways.** By count: answers that ended inside the window over its length. By
  Little's law: the mean number in flight over the window (from every request's start and end,
  those still running at its end included) over the mean latency of the window's answers; for a
  closed loop also C over that latency. Both, with p50/p99, come from the same records.
- **Order.** Layouts compared in a pass run A B B A, so slow drift falls on both sides.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.bench.stats import quantile

WINDOW_S = 120.0  # the least a steady window may last
LATENCIES = 10.0  # ... and the fewest mean latencies it must hold
CANCELLED = "cancelled"  # a request still in flight when the load ended


@dataclass(frozen=True, slots=True)
class Record:
    """One request, seconds from the load's start; `worker` -1 for open-loop arrivals."""

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
    """When each of `concurrency` closed-loop clients starts: evenly over `seconds`."""
    return [seconds * index / concurrency for index in range(concurrency)]


def poisson(rate: float, seconds: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process at `rate` per second over [0, seconds), seeded."""
    chance = random.Random(seed)  # noqa: S311 (arrival times, not secrets)
    times: list[float] = []
    now = chance.expovariate(rate)
    while now < seconds:
        times.append(now)
        now += chance.expovariate(rate)
    return times


def abba(first: str, second: str) -> list[str]:
    """The order two layouts are measured in: A B B A."""
    return [first, second, second, first]


def closed_start(records: Iterable[Record], concurrency: int, ramp_s: float) -> float | None:
    """A closed loop's window start: the ramp is over and each of the C clients has finished a
    request (the starts' bunching is behind us); None while one has not."""
    first: dict[int, float] = {}
    for record in records:
        if record.status != CANCELLED and record.worker >= 0:
            first[record.worker] = min(record.end, first.get(record.worker, math.inf))
    if len(first) < concurrency:
        return None
    return max(ramp_s, *first.values())


def open_start(records: Iterable[Record], settle: float, least: float = 5.0) -> float | None:
    """An open loop's window start: `settle` mean latencies of the first 20 answers (at least
    `least` seconds) after the first arrival; None before 20 answers."""
    done = sorted((r for r in records if r.ok), key=lambda r: r.end)[:20]
    if len(done) < 20:
        return None
    mean = sum(r.latency for r in done) / len(done)
    return max(least, min(r.start for r in done) + settle * mean)


def window_end(
    records: Sequence[Record], start: float, now: float, *,
    window: float = WINDOW_S, latencies: float = LATENCIES,
) -> float | None:  # fmt: skip
    """`now`, once a window from `start` to `now` lasts `window` seconds and `latencies` mean
    latencies of its own answers; None while not."""
    done = [r.latency for r in records if r.ok and start <= r.end <= now]
    if not done or now - start < max(window, latencies * sum(done) / len(done)):
        return None
    return now  # the window [start, now] holds exactly the answers its mean was taken over


def in_flight(records: Iterable[Record], start: float, end: float) -> float:
    """The mean number of requests in flight over [start, end], from each one's span."""
    busy = sum(max(0.0, min(r.end, end) - max(r.start, start)) for r in records)
    return busy / (end - start)


def figures(
    records: Sequence[Record], start: float, end: float, concurrency: int | None = None, *,
    window: float = WINDOW_S, latencies: float = LATENCIES,
) -> dict[str, Any]:  # fmt: skip
    """A window's figures: pages/s by count and by Little's law, latency quantiles, statuses,
    how many mean latencies it held and whether it counts as steady."""
    seconds = end - start
    ended = [r for r in records if start <= r.end <= end and r.status != CANCELLED]
    ok = [r for r in ended if r.ok]
    lat = [r.latency for r in ok]
    mean = sum(lat) / len(lat) if lat else math.nan
    flight = in_flight(records, start, end)
    halves = [sum(1 for r in ok if a <= r.end < b) / (seconds / 2)
              for a, b in ((start, start + seconds / 2), (start + seconds / 2, end))]  # fmt: skip
    held = seconds / mean if lat else 0.0
    return {
        "window_s": [start, end],
        "seconds": seconds,
        "answered": len(ok),
        "statuses": dict(sorted(Counter(r.status for r in ended).items())),
        "pages_per_s_count": len(ok) / seconds,
        "pages_per_s_little": flight / mean if lat else 0.0,
        "pages_per_s_c_over_latency": concurrency / mean if lat and concurrency else None,
        "in_flight_mean": flight,
        "latency_s": {
            "mean": mean,
            "p50": quantile(lat, 0.5),
            "p99": quantile(lat, 0.99),
            "max": max(lat),
        }
        if lat
        else None,
        "output_tokens_per_s": sum(r.tokens for r in ok) / seconds,
        "halves_pages_per_s": halves,  # a drifting window shows here
        "latencies_held": held,
        "steady": seconds >= window - 1e-9 and held >= latencies,
    }
