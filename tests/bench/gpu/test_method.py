"""bench.gpu.method: arrivals, the steady window and the two pages/s, on records made to order."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from bench.gpu import method
from bench.gpu.method import Record


def back_to_back(clients: int, service: float, until: float, stagger: float = 0.0) -> list[Record]:
    """A closed loop against a server that takes exactly `service` s: client w starts at
    w x stagger and sends its next request the moment an answer is in, until `until`."""
    records = []
    for worker in range(clients):
        start = worker * stagger
        while start + service <= until:
            records.append(Record(worker, start, start + service, "200", 256))
            start += service
    return records


def test_poisson_arrivals_come_at_the_rate_asked_and_are_seeded() -> None:
    """20/s over 200 s: 4,000 arrivals within 5 standard deviations, mean gap 1/20 s within
    5 %, exponential gaps (their spread equals their mean), and the seed fixes them."""
    times = method.poisson(20.0, 200.0, seed=1)
    assert abs(len(times) - 4000) < 5 * math.sqrt(4000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.mean(gaps) == pytest.approx(0.05, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.1)
    assert all(0 <= t < 200 for t in times)
    assert times == sorted(times)
    assert method.poisson(20.0, 200.0, seed=1) == times
    assert method.poisson(20.0, 200.0, seed=2) != times


def test_the_ramp_starts_clients_evenly_from_zero() -> None:
    """8 clients over 4 s start 0.5 s apart, the first at once, none at the ramp's end."""
    assert method.ramp(8, 4.0) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert method.ramp(3, 0.0) == [0.0, 0.0, 0.0]


def test_layouts_are_measured_a_b_b_a() -> None:
    """Two layouts in a pass: A, B, then B, A, so drift falls on both."""
    assert method.abba("stock", "plugin") == ["stock", "plugin", "plugin", "stock"]


def test_a_closed_window_starts_once_every_client_has_an_answer_after_the_ramp() -> None:
    """Client 2 (started last, at 1 s) answers first at 3 s; the window starts then. While a
    client has no answer (cancelled ones do not count) there is no start yet."""
    records = back_to_back(3, 2.0, 20.0, stagger=0.5)
    assert method.closed_start(records, 3, ramp_s=1.0) == pytest.approx(3.0)
    assert method.closed_start(records, 3, ramp_s=5.0) == pytest.approx(5.0)
    waiting = [r for r in records if r.worker != 2] + [Record(2, 1.0, 9.0, method.CANCELLED)]
    assert method.closed_start(waiting, 3, ramp_s=1.0) is None


def test_an_open_window_skips_settle_mean_latencies_of_the_first_answers() -> None:
    """20 answers of 3 s from t=1: the window starts 2 x 3 s after the first arrival; fewer
    than 20 answers: not yet; never before `least` seconds."""
    records = [Record(-1, 1 + i * 0.1, 4 + i * 0.1, "200") for i in range(25)]
    assert method.open_start(records, settle=2.0) == pytest.approx(7.0)
    assert method.open_start(records[:19], settle=2.0) is None
    assert method.open_start(records, settle=0.5, least=5.0) == pytest.approx(5.0)


def test_a_window_lasts_the_longer_of_its_seconds_and_its_latencies() -> None:
    """Latencies of 2 s: 10 of them (20 s) fit in a 12 s minimum only once 20 s have passed;
    latencies of 0.5 s: the 12 s minimum rules."""
    slow = back_to_back(4, 2.0, 60.0, stagger=0.5)
    assert method.window_end(slow, 3.0, now=15.0, window=12.0) is None
    assert method.window_end(slow, 3.0, now=22.0, window=12.0) is None
    assert method.window_end(slow, 3.0, now=23.0, window=12.0) == pytest.approx(23.0)
    fast = back_to_back(4, 0.5, 60.0, stagger=0.125)
    assert method.window_end(fast, 3.0, now=14.9, window=12.0) is None
    assert method.window_end(fast, 3.0, now=15.0, window=12.0) == pytest.approx(15.0)


def test_a_steady_closed_loop_gives_the_same_pages_per_s_both_ways() -> None:
    """4 clients, 2 s each, back to back: 2 pages/s by count, by Little's law and by C over
    the mean latency; p50 = p99 = 2 s; 40 latencies held."""
    records = back_to_back(4, 2.0, 100.0, stagger=0.5)
    f = method.figures(records, 10.25, 90.25, concurrency=4, window=60.0)
    assert f["answered"] == 160
    assert f["pages_per_s_count"] == pytest.approx(2.0)
    assert f["pages_per_s_little"] == pytest.approx(2.0)
    assert f["pages_per_s_c_over_latency"] == pytest.approx(2.0)
    assert f["in_flight_mean"] == pytest.approx(4.0)
    assert f["latency_s"]["p50"] == f["latency_s"]["p99"] == pytest.approx(2.0)
    assert f["latencies_held"] == pytest.approx(40.0)
    assert f["steady"] is True
    assert f["halves_pages_per_s"] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert f["output_tokens_per_s"] == pytest.approx(512.0)


def test_an_open_loop_s_rate_by_little_counts_what_is_in_flight() -> None:
    """Arrivals every 0.5 s, each answered in 3 s: 6 in flight, 2 pages/s both ways."""
    records = [Record(-1, i * 0.5, i * 0.5 + 3.0, "200") for i in range(400)]
    f = method.figures(records, 20.25, 180.25, window=120.0)
    assert f["pages_per_s_count"] == pytest.approx(2.0)
    assert f["in_flight_mean"] == pytest.approx(6.0)
    assert f["pages_per_s_little"] == pytest.approx(2.0)
    assert f["pages_per_s_c_over_latency"] is None
    assert f["steady"] is True


def test_lock_step_waves_make_a_short_window_read_anything() -> None:
    """All 8 clients started at once with 10 s answers (the served pass's flaw): a 5 s window
    counts one wave or none, 1.6 or 0 pages/s against 0.8 by Little's law, and is not steady;
    a window of many latencies reads the true 0.8 both ways."""
    records = back_to_back(8, 10.0, 400.0)
    wave = method.figures(records, 18.0, 23.0, concurrency=8)
    gap = method.figures(records, 21.0, 26.0, concurrency=8)
    assert (wave["pages_per_s_count"], gap["pages_per_s_count"]) == (1.6, 0.0)
    assert wave["pages_per_s_little"] == pytest.approx(0.8)
    assert wave["steady"] is False
    long = method.figures(records, 15.0, 395.0, concurrency=8)
    assert long["pages_per_s_count"] == pytest.approx(0.8, rel=0.03)
    assert long["pages_per_s_little"] == pytest.approx(0.8)
    assert long["steady"] is True


def test_errors_are_counted_apart_and_cancelled_requests_only_as_in_flight() -> None:
    """A 503 is a status of the window, not an answer; a request cancelled at the load's end
    counts in the mean in flight up to the window's end and nowhere else."""
    records = [Record(0, 0.0, 2.0, "200"), Record(0, 2.0, 2.1, "503"), Record(0, 2.1, 4.1, "200"),
               Record(1, 0.0, 9.0, method.CANCELLED)]  # fmt: skip
    f = method.figures(records, 0.0, 4.5, concurrency=2, window=1.0, latencies=1.0)
    assert f["statuses"] == {"200": 2, "503": 1}
    assert f["answered"] == 2
    assert f["in_flight_mean"] == pytest.approx((2.0 + 0.1 + 2.0 + 4.5) / 4.5)


def test_a_window_of_fewer_latencies_or_seconds_than_asked_is_not_steady() -> None:
    """120 s holding 6 mean latencies of 20 s, or 100 s holding 50 of 2 s: neither is steady."""
    slow = back_to_back(4, 20.0, 400.0, stagger=5.0)
    assert method.figures(slow, 40.0, 160.0, concurrency=4)["steady"] is False
    fast = back_to_back(4, 2.0, 400.0, stagger=0.5)
    assert method.figures(fast, 40.0, 140.0, concurrency=4)["steady"] is False
    assert method.figures(fast, 40.0, 160.0, concurrency=4)["steady"] is True
