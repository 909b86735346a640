"""The soak report's logic (bench/soak/report.py, faults.py) on synthetic data."""

from __future__ import annotations

import pytest

from bench.soak.faults import parse_schedule
from bench.soak.report import (
    OUTSIDE,
    Attempt,
    Outcome,
    Window,
    failures,
    jobs_summary,
    per_minute,
    rss_growth,
    verdicts,
    window_of,
)

MB = 2**20


def _windows() -> list[Window]:
    return [
        Window("engine-kill", "engine-1", start=100, healthy_at=150, grace=10),
        Window("redis-restart", "redis", start=300, healthy_at=302, grace=10),
    ]


def _ok(kind: str, at: float) -> Outcome:
    return Outcome(kind, at - 1, at, [Attempt(at, 200)], ok=True)


def test_a_time_falls_in_the_window_from_the_fault_to_healthy_plus_grace() -> None:
    """A window runs from its fault to `grace` s after healthy again; elsewhere is outside."""
    windows = _windows()
    assert window_of(99.9, windows) == OUTSIDE
    assert window_of(100, windows) == "engine-kill engine-1 @100s"
    assert window_of(159.9, windows) == "engine-kill engine-1 @100s"
    assert window_of(160.1, windows) == OUTSIDE
    assert window_of(305, windows) == "redis-restart redis @300s"


def test_a_time_in_overlapping_windows_names_each_of_them() -> None:
    """Faults that overlap (a restart still under way when the next fault comes) both count."""
    windows = [*_windows(), Window("gateway-kill", "gateway-a", start=140, healthy_at=145)]
    assert window_of(142, windows) == "engine-kill engine-1 @100s + gateway-kill gateway-a @140s"


def test_a_part_that_never_came_back_keeps_its_window_open() -> None:
    """With no healthy time, the window never closes."""
    assert window_of(10**6, [Window("gateway-kill", "gateway-a", start=5)]) != OUTSIDE


def test_each_failed_attempt_is_tied_to_its_window_and_to_whether_its_request_recovered() -> None:
    """A retried 503 inside a window is recovered; a 500 outside is not."""
    retried = Outcome("chat", 120, 125, [Attempt(121, 503, "1"), Attempt(124, 200)], ok=True)
    broken = Outcome("ocr", 200, 201, [Attempt(201, 500)], ok=False)
    rows = failures([retried, broken, _ok("chat", 50)], _windows())
    assert [(r["kind"], r["status"], r["window"], r["recovered"]) for r in rows] == [
        ("chat", 503, "engine-kill engine-1 @100s", True),
        ("ocr", 500, OUTSIDE, False),
    ]


def test_an_answer_that_was_wrong_though_every_attempt_was_2xx_is_a_failure() -> None:
    """A 200 whose content failed the check (e.g. a page missing) counts as a failure."""
    rows = failures([Outcome("job", 10, 20, [Attempt(20, 200)], ok=False, detail="pages [1]")], [])
    assert (rows[0]["status"], rows[0]["window"], rows[0]["recovered"]) == (None, OUTSIDE, False)


def test_a_stream_broken_after_its_200_is_marked_cut_mid_answer() -> None:
    """A 200 then a lost connection is a stream cut mid-answer; a refused connection is not."""
    cut = Outcome("chat-stream", 0, 5, [Attempt(1, 200), Attempt(5, 0, error="reset")], ok=False)
    refused = Outcome("chat", 0, 5, [Attempt(1, 0, error="refused"), Attempt(5, 200)], ok=True)
    rows = failures([cut, refused], [])
    assert [(r["kind"], r["cut_mid_answer"]) for r in rows] == [
        ("chat", False),
        ("chat-stream", True),
    ]


def test_attempts_are_counted_per_minute_by_status() -> None:
    """Each attempt lands in the minute its answer came; no answer is its own column."""
    outcomes = [
        Outcome("chat", 0, 70, [Attempt(10, 503, "1"), Attempt(70, 200)], ok=True),
        Outcome("chat", 0, 130, [Attempt(59.9, 0, error="refused"), Attempt(130, 200)], ok=True),
    ]
    rows = per_minute(outcomes, seconds=150)
    assert rows == [
        {"minute": 0, "statuses": {"503": 1, "no answer": 1}},
        {"minute": 1, "statuses": {"200": 1}},
        {"minute": 2, "statuses": {"200": 1}},
    ]


def test_rss_growth_is_judged_per_process_after_its_own_warm_up() -> None:
    """Growth compares the first and last quarter after warm-up; a restarted process (new PID)
    is judged alone; too few samples are not judged."""
    steady = [(t, 1, (100 + (50 if t < 30 else 0)) * MB) for t in range(0, 200, 5)]
    growing = [(t, 2, int((100 + t * 0.2) * MB)) for t in range(0, 200, 5)]
    restarted = [(t, 3, 100 * MB) for t in range(200, 215, 5)]
    rows = rss_growth({"gateway-a": steady, "gateway-b": growing + restarted}, warmup=30)
    by_pid = {row["pid"]: row for row in rows}
    assert by_pid[1]["growth"] == pytest.approx(0.0)
    assert by_pid[1]["pass"] is True
    assert by_pid[2]["growth"] > 0.10
    assert by_pid[2]["pass"] is False
    assert (by_pid[3]["growth"], by_pid[3]["pass"]) == (None, None)


def test_jobs_count_completed_only_with_every_page_and_sum_the_pages_lost() -> None:
    """A succeeded job missing a page is not completed; its missing page is lost."""
    records = [
        {"id": "a", "pages": 4, "status": "succeeded", "pages_ok": 4},
        {"id": "b", "pages": 4, "status": "succeeded", "pages_ok": 3},
        {"id": "c", "pages": 4, "status": "running", "pages_ok": 0},
    ]
    summary = jobs_summary(records)
    assert (summary["submitted"], summary["completed"], summary["pages_lost"]) == (3, 1, 5)


def _verdicts(rows: list[dict[str, object]], pages_lost: int = 0) -> dict[str, bool]:
    growth = [{"part": "gateway-a", "pid": 1, "growth": 0.02, "pass": True}]
    jobs = {"submitted": 2, "completed": 2 - bool(pages_lost), "pages_lost": pages_lost}
    result = verdicts(rows, growth, jobs, _windows(), submit_failures=0)  # type: ignore[arg-type]
    return {name: bool(v["pass"]) for name, v in result.items()}


def _row(
    window: str, status: int | None, retry_after: str | None, recovered: bool
) -> dict[str, object]:
    return {"kind": "chat", "window": window, "status": status, "retry_after": retry_after,
            "recovered": recovered}  # fmt: skip


def test_every_target_passes_with_only_retried_503s_inside_windows() -> None:
    """503 + Retry-After in a window, retried to success, fails no target."""
    rows = [_row("engine-kill engine-1 @100s", 503, "1", True)]
    assert all(_verdicts(rows).values())


def test_each_target_fails_on_its_own_kind_of_fault() -> None:
    """Outside failure, a 500 or a 503 without Retry-After inside, a lost page, a request lost
    in the Redis window: each fails its target."""
    assert not _verdicts([_row(OUTSIDE, 502, "1", True)])["0 failures outside fault windows"]
    inside = "inside windows only 502/503 + Retry-After, then retried to success"
    assert not _verdicts([_row("engine-kill engine-1 @100s", 500, None, True)])[inside]
    assert not _verdicts([_row("engine-kill engine-1 @100s", 503, None, True)])[inside]
    assert not _verdicts([_row("engine-kill engine-1 @100s", 503, "1", False)])[inside]
    assert not _verdicts([], pages_lost=1)["0 jobs or pages lost"]
    redis = _verdicts([_row("redis-restart redis @300s", 503, "5", False)])
    assert not redis["redis restart costs no request"]
    assert _verdicts([_row("redis-restart redis @300s", 503, "5", True)])[
        "redis restart costs no request"
    ]
    overlapping = "engine-kill engine-1 @100s + redis-restart redis @300s"
    assert not _verdicts([_row(overlapping, 503, "5", False)])["redis restart costs no request"]


def test_rss_target_fails_when_a_process_grew_more_than_ten_percent() -> None:
    """One process over +10 % fails the RSS target."""
    growth = [{"part": "nginx", "pid": 9, "growth": 0.25, "pass": False}]
    jobs = {"submitted": 0, "completed": 0, "pages_lost": 0}
    result = verdicts([], growth, jobs, _windows(), submit_failures=0)
    assert not result["rss growth <= 10 % after warm-up"]["pass"]
    assert "nginx pid 9 +25.0%" in result["rss growth <= 10 % after warm-up"]["detail"]


def test_the_schedule_is_read_in_time_order_and_bad_entries_are_named() -> None:
    """`FAULT:FRACTION` entries come back sorted; an unknown fault or fraction >= 1 is refused."""
    planned = parse_schedule("nginx-reload:0.7,engine-kill:0.1")
    assert [(p.fault, p.at) for p in planned] == [("engine-kill", 0.1), ("nginx-reload", 0.7)]
    with pytest.raises(ValueError, match=r"'reboot:0\.2'"):
        parse_schedule("reboot:0.2")
    with pytest.raises(ValueError, match=r"'engine-kill:1\.5'"):
        parse_schedule("engine-kill:1.5")
