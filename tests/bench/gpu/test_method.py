"""bench.gpu.method (method 2): windows, flatness, the median window and the summary, on records
made to order."""

from __future__ import annotations

import json
import math

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
            records.append(Record(worker, start, start + service, "200", 100))
            start += service
    return records


def test_variants_interleave_a_b_b_a_and_each_gets_its_windows() -> None:
    """Two variants, three windows each: A B B A A B; one variant: its windows in a row."""
    assert method.order(["default", "layout"], 3) == [
        "default", "layout", "layout", "default", "default", "layout"]  # fmt: skip
    assert method.order(["x"], 3) == ["x", "x", "x"]


def test_the_window_starts_after_the_ramp_and_every_clients_first_answer() -> None:
    """4 clients staggered 1 s apart with 3 s answers: client 3's first answer at 6 s is the
    start; a ramp longer than that wins; a client with no answer yet: no start."""
    records = back_to_back(4, 3.0, 60.0, stagger=1.0)
    assert method.window_start(records, 4, 2.0) == 6.0
    assert method.window_start(records, 4, 8.0) == 8.0
    assert method.window_start(records, 5, 2.0) is None


def test_a_window_ends_only_after_its_seconds_and_its_mean_latencies() -> None:
    """3 s answers: a 20 s window needs 30 s for 10 latencies; 120 s windows end at 120 s."""
    records = back_to_back(2, 3.0, 400.0)
    assert method.window_end(records, 0.0, 25.0, window=20.0, latencies=10.0) is None
    assert method.window_end(records, 0.0, 30.0, window=20.0, latencies=10.0) == 30.0
    assert method.window_end(records, 0.0, 119.0) is None
    assert method.window_end(records, 0.0, 120.0) == 120.0


def test_a_steady_loop_is_flat_and_both_pages_per_s_agree() -> None:
    """8 clients staggered over one service time answer evenly: bins equal (cv 0), by count and
    by Little's law both C / service, 40 latencies held; the five summary keys are there."""
    records = back_to_back(8, 2.0, 200.0, stagger=0.25)
    found = method.window(records, 20.0, 100.0)
    assert set(method.WINDOW_KEYS) <= set(found)
    assert found["bins"] == [40] * 8
    assert found["bins_cv"] == 0.0
    assert found["flat"] is True
    assert found["pages_per_s_by_count"] == pytest.approx(4.0)
    assert found["pages_per_s_by_latency"] == pytest.approx(4.0)
    assert found["mean_latencies"] == pytest.approx(40.0)
    assert found["steady"] is False  # 80 s is under the 120 s a window needs


def test_lock_step_waves_are_not_flat() -> None:
    """Every client started at once with equal answers: all answers land in the same bins every
    service time (the read of passes 9-13): the cv is far above 0.15, the window not flat."""
    records = back_to_back(64, 13.5, 300.0)
    found = method.window(records, 13.5, 283.5)
    assert found["bins_cv"] > 3 * method.FLAT_CV
    assert found["flat"] is False


def test_bins_drop_the_last_partial_bin_and_count_only_answers() -> None:
    """25 s in 10 s bins: two bins, (0, 10] and (10, 20]; an answer at the start belongs to the
    window before; a cancelled request and an error are not answers."""
    records = [Record(0, 0.0, 5.0, "200"), Record(0, 5.0, 15.0, "200"), Record(3, -4.0, 0.0, "200"),
               Record(1, 0.0, 12.0, "500"), Record(1, 12.0, 22.0, method.CANCELLED),
               Record(2, 0.0, 24.0, "200"), Record(4, 10.0, 20.0, "200")]  # fmt: skip
    assert method.bins(records, 0.0, 25.0, 10.0) == [1, 2]
    assert method.cv([2, 2]) == 0.0
    assert method.cv([3]) == math.inf  # one bin says nothing about flatness
    assert method.cv([0, 0]) == math.inf


def test_the_figure_is_the_median_window_by_count_with_the_spread_beside_it() -> None:
    """Three windows at 40, 38 and 41 pages/s: the figure 40 (window 0), spread 38-41 (7.5 %);
    four windows: the lower middle; a window not flat shows in all_flat."""
    windows = [{"pages_per_s_by_count": v, "pages_per_s_by_latency": v + 1, "bins_cv": cv}
               for v, cv in ((40.0, 0.05), (38.0, 0.08), (41.0, 0.2))]  # fmt: skip
    figure = method.median(windows)
    assert figure["pages_per_s_by_count"] == 40.0
    assert figure["pages_per_s_by_latency"] == 41.0
    assert figure["window"] == 0
    assert figure["spread"] == {"min": 38.0, "max": 41.0, "relative": pytest.approx(3 / 40)}
    assert figure["all_flat"] is False
    four = [*windows, {"pages_per_s_by_count": 39.0, "pages_per_s_by_latency": 39, "bins_cv": 0}]
    assert method.median(four)["pages_per_s_by_count"] == 39.0
    assert method.of_floor(40.0, 22.74) == pytest.approx(0.9096)


def test_the_summary_has_exactly_the_issues_shape() -> None:
    """issue 50 item 5's keys, nothing more, nothing less, at every level; JSON-serialisable."""
    records = back_to_back(8, 2.0, 200.0, stagger=0.25)
    found = method.window(records, 20.0, 160.0)
    variant = {"name": "default", "stack": "make serve", "concurrency": 8,
               "floor_ms_per_page": 22.7, "windows": [found, found, found]}  # fmt: skip
    floor = {"ms_per_page": 22.7, "definition": "d", "x": 1}
    variants = [variant, variant | {"name": "layout"}]
    summary = method.summary("NVIDIA H200", floor, variants, 150.0, "raw.tar.gz")
    assert list(summary) == ["method", "gpu", "floor", "variants",
                             "layout_service_alone_pages_per_s", "raw"]  # fmt: skip
    assert summary["method"] == 2
    assert set(summary["floor"]) == {"ms_per_page", "definition"}
    assert [v["name"] for v in summary["variants"]] == ["default", "layout"]
    for v in summary["variants"]:
        assert set(v) == {"name", "stack", "concurrency", "floor_ms_per_page", "windows"}
        assert [set(w) for w in v["windows"]] == [set(method.WINDOW_KEYS)] * 3
    assert json.loads(json.dumps(summary)) == summary
