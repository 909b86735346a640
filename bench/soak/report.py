"""The soak report's logic, on plain data: fault windows, requests per minute, RSS growth,
and the verdict on each target. Nothing here starts a process (tests/bench/test_soak.py)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

RSS_GROWTH_LIMIT = 0.10
RECOVERABLE = (502, 503)
OUTSIDE = "outside"


@dataclass
class Attempt:
    """One HTTP attempt of a request: when its answer came (run seconds) and its status
    (0: no answer, the connection failed). `ok` None: a 2xx is a success."""

    at: float
    status: int
    retry_after: str | None = None
    error: str = ""
    ok: bool | None = None

    @property
    def succeeded(self) -> bool:
        """Whether this attempt is what the client wanted."""
        return self.ok if self.ok is not None else 200 <= self.status < 300


@dataclass
class Outcome:
    """One client request (or job) and every attempt it took; `ok`: it ended as it should."""

    kind: str
    started: float
    ended: float
    attempts: list[Attempt]
    ok: bool
    detail: str = ""


@dataclass
class Window:
    """A fault's window: from the fault to `grace` s after the part was healthy again."""

    fault: str  # e.g. "engine-kill"
    target: str  # the part's name
    start: float
    healthy_at: float | None = None  # None: it never came back
    grace: float = 10.0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        """Where the window closes (never, if the part never came back)."""
        return float("inf") if self.healthy_at is None else self.healthy_at + self.grace

    @property
    def label(self) -> str:
        """How the report names it."""
        return f"{self.fault} {self.target} @{self.start:.0f}s"


def window_of(at: float, windows: list[Window]) -> str:
    """The labels of every window holding `at` (faults can overlap), else "outside"."""
    held = [window.label for window in windows if window.start <= at <= window.end]
    return " + ".join(held) or OUTSIDE


def failures(outcomes: list[Outcome], windows: list[Window]) -> list[dict[str, Any]]:
    """Every failed attempt, with its window, and whether its request still ended well."""
    rows = []
    for outcome in outcomes:
        for index, attempt in enumerate(outcome.attempts):
            if attempt.succeeded:
                continue
            # a stream already answered 200 whose connection then broke: no retry resumes it
            cut = attempt.status == 0 and any(a.status == 200 for a in outcome.attempts[:index])
            rows.append({
                "kind": outcome.kind, "at": round(attempt.at, 2), "status": attempt.status,
                "retry_after": attempt.retry_after, "error": attempt.error,
                "window": window_of(attempt.at, windows), "recovered": outcome.ok,
                "cut_mid_answer": cut, "detail": outcome.detail,
            })  # fmt: skip
        if not outcome.ok and all(a.succeeded for a in outcome.attempts):
            at = outcome.attempts[-1].at if outcome.attempts else outcome.ended
            rows.append({
                "kind": outcome.kind, "at": round(at, 2), "status": None, "retry_after": None,
                "error": "answered, but not as it should be", "window": window_of(at, windows),
                "recovered": False, "cut_mid_answer": False, "detail": outcome.detail,
            })  # fmt: skip
    return sorted(rows, key=lambda row: row["at"])


def per_minute(outcomes: list[Outcome], seconds: float) -> list[dict[str, Any]]:
    """Attempts by status, per minute of the run (by when each answer came)."""
    minutes = max(int(seconds // 60) + (seconds % 60 > 0), 1)
    counts: list[Counter[str]] = [Counter() for _ in range(minutes)]
    for outcome in outcomes:
        for attempt in outcome.attempts:
            index = min(max(int(attempt.at // 60), 0), minutes - 1)
            counts[index][str(attempt.status) if attempt.status else "no answer"] += 1
    return [{"minute": i, "statuses": dict(sorted(c.items()))} for i, c in enumerate(counts)]


def rss_growth(
    samples: dict[str, list[tuple[float, Any, int]]], warmup: float, minimum: int = 4
) -> list[dict[str, Any]]:
    """RSS growth of every life (part, PID and generation) of each part, from its samples after
    `warmup` s of its own life to its last ones (medians of the first and last quarter of
    them); incarnations with fewer than `minimum` samples past warm-up are not judged."""
    rows = []
    for name, series in samples.items():
        lives: dict[Any, list[tuple[float, int]]] = defaultdict(list)
        for at, pid, rss in series:
            lives[pid].append((at, rss))
        for pid, life in lives.items():
            born = life[0][0]
            judged = [rss for at, rss in life if at - born >= warmup]
            row: dict[str, Any] = {"part": name, "pid": pid, "samples": len(judged)}
            if len(judged) < minimum:
                rows.append({**row, "growth": None, "pass": None})
                continue
            quarter = max(len(judged) // 4, 1)
            first = statistics.median(judged[:quarter])
            last = statistics.median(judged[-quarter:])
            growth = last / first - 1
            rows.append({
                **row, "first_mb": first / 2**20, "last_mb": last / 2**20,
                "peak_mb": max(judged) / 2**20, "growth": growth,
                "pass": growth <= RSS_GROWTH_LIMIT,
            })  # fmt: skip
    return rows


def jobs_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Jobs submitted and completed, and the pages the completed-or-not jobs lost."""
    completed = [r for r in records if r["status"] == "succeeded" and r["pages_ok"] == r["pages"]]
    return {
        "submitted": len(records),
        "completed": len(completed),
        "pages_submitted": sum(r["pages"] for r in records),
        "pages_lost": sum(r["pages"] - r["pages_ok"] for r in records),
        "not_completed": [r for r in records if r not in completed],
    }


def verdicts(
    failed: list[dict[str, Any]], growth: list[dict[str, Any]], jobs: dict[str, Any],
    windows: list[Window], submit_failures: int,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each target: pass or fail, and the numbers behind it."""
    outside = [row for row in failed if row["window"] == OUTSIDE]
    inside = [row for row in failed if row["window"] != OUTSIDE]
    wrong = [
        row for row in inside
        if row["status"] not in RECOVERABLE or not row["retry_after"] or not row["recovered"]
    ]  # fmt: skip
    cut = sum(1 for row in wrong if row.get("cut_mid_answer"))
    judged = [row for row in growth if row["pass"] is not None]
    grown = [row for row in judged if not row["pass"]]
    redis = [w.label for w in windows if w.fault == "redis-restart"]
    in_redis = [row for row in failed if any(label in row["window"] for label in redis)]
    redis_lost = [row for row in in_redis if not row["recovered"]]
    jobs_ok = jobs["submitted"] == jobs["completed"] and not jobs["pages_lost"]
    return {
        "rss growth <= 10 % after warm-up": {
            "pass": not grown and bool(judged),
            "detail": f"{len(judged)} processes judged, {len(grown)} over: "
            + ", ".join(f"{r['part']} pid {r['pid']} {r['growth']:+.1%}" for r in grown),
        },
        "0 failures outside fault windows": {
            "pass": not outside,
            "detail": f"{len(outside)} failed attempts outside",
        },
        "inside windows only 502/503 + Retry-After, then retried to success": {
            "pass": not wrong,
            "detail": f"{len(inside)} failed attempts inside, {len(wrong)} not so "
            f"({cut} of them streams cut mid-answer, which no retry can resume): "
            + ", ".join(sorted({f"{r['kind']} {r['status']}" for r in wrong})),
        },
        "0 jobs or pages lost": {
            "pass": jobs_ok and not submit_failures,
            "detail": f"{jobs['completed']}/{jobs['submitted']} jobs completed, "
            f"{jobs['pages_lost']} pages lost, {submit_failures} submits never accepted",
        },
        "redis restart costs no request": {
            "pass": bool(redis) and not redis_lost,
            "detail": f"{len(redis_lost)} requests lost in {len(redis)} Redis windows; "
            f"{len(in_redis)} failed attempts there",
        },
    }


def as_json(**parts: Any) -> dict[str, Any]:
    """Dataclasses and all, as plain JSON values."""

    def plain(value: Any) -> Any:
        if isinstance(value, Window):
            return {**asdict(value), "end": value.end, "label": value.label}
        if isinstance(value, Outcome | Attempt):
            return asdict(value)
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {name: plain(value) for name, value in parts.items()}
