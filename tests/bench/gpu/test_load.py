"""bench.gpu.load, the whole loop in miniature: a real gateway (in a thread) in front of a
FakeVLLM whose every answer takes a fixed time, /v1/ocr on the varied corpus; and the layout
API at bench.gpu.layout_standin. The windows are seconds long, not 120."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from bench.gpu import corpus, layout_standin, load, method
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.layout_standin import LayoutStandin
from tests.support.servers import ThreadedServer, serving

SERVICE_S = 0.2  # the fake engine's time per answer


def run(tmp_path: Path, url: str, *options: str) -> dict[str, Any]:
    return runs(tmp_path, url, "--name", "w", *options)[0]


def runs(tmp_path: Path, url: str, *options: str) -> list[dict[str, Any]]:
    """The load's windows' reports."""
    args = load.parser().parse_args(
        [url, "--out", str(tmp_path), "--window", "3", "--latencies", "5",
         "--bin", "1", "--ramp", "0.4", "--tick", "0.2", "--max-seconds", "40", "--pages", "14",
         "--median", "20", "--key", CLIENT_KEY, *options]
    )  # fmt: skip
    pages = load.pages(args.pages, corpus.Lengths(args.median, args.sigma))
    return asyncio.run(load.measure(args, pages))


def test_a_window_of_varied_pages_through_the_gateway_is_steady_and_its_csv_recomputes_it(
    tmp_path: Path,
) -> None:
    """4 clients, 0.2 s answers: every page answered 200, the window holds 3 s and 5 latencies,
    pages/s by count at most C / 0.2 s and by latency the same (Little's law); the engine saw
    each page's drawn length as max_tokens (not one length);
    every request is in the CSV with its page, and the figures recompute from it. The gateway's
    results cache is on (its default), yet every page answered was the engine's work: 14 pages
    cycled would otherwise be answered from the cache after their first reading."""
    with serving(FakeVLLM(delay=SERVICE_S)) as fake, \
            ThreadedServer(create_app(settings_for(fake.url, cache="on"))) as gateway:  # fmt: skip
        report = run(tmp_path, gateway.url, "--concurrency", "4", "--api", "ocr")
    assert report["statuses"] == {"200": report["answered"]}
    assert report["steady"] is True
    assert report["window_rule"] == "met"
    assert report["seconds"] >= 3.0
    assert report["mean_latencies"] >= 5.0
    assert report["latency_s"]["p50"] >= SERVICE_S  # each answer waited for the engine's
    assert 0 < report["pages_per_s_by_count"] <= 4 / SERVICE_S
    # a closed loop keeps C in flight: Little's law reads what the count reads
    assert report["pages_per_s_by_latency"] == pytest.approx(report["pages_per_s_by_count"],
                                                             rel=0.25)  # fmt: skip
    sent = {body["max_tokens"] for body in fake.bodies}
    assert len(sent) > 3  # lengths drawn per page
    assert sent <= {corpus.Lengths(20).of(n) for n in range(14)}
    with (tmp_path / "w.requests.csv").open() as rows:
        pages = {int(row["page"]) for row in csv.DictReader(rows)}
    assert len(pages) > 7  # several kinds of page, cycled in a seeded order
    records = load.read_records(tmp_path / "w.requests.csv")
    assert len(records) == report["requests"]
    answered = [r for r in records if r.ok]
    assert len(answered) > 14  # pages read more than once in the whole load
    assert len(fake.bodies) >= len(answered)  # every one of them by the engine
    again = method.window(records, *report["span_s"], window_s=3.0, latencies=5.0, bin_s=1.0)
    for key in method.WINDOW_KEYS:
        assert again[key] == pytest.approx(report[key])


def test_two_windows_in_a_row_are_one_load_the_second_from_where_the_first_ended(
    tmp_path: Path,
) -> None:
    """`--name a,b`: two windows of one load, no ramp between (the second starts where the first
    ended), each steady by its own answers, each with the load's CSV beside its report, each
    recomputed from it by its own span."""
    with ThreadedServer(layout_standin.app()) as standin:
        first, second = runs(tmp_path, standin.url, "--name", "a,b", "--concurrency", "2",
                             "--api", "layout", "--window", "1", "--latencies", "3")  # fmt: skip
    assert [first["name"], second["name"]] == ["a", "b"]
    assert first["span_s"][1] == second["span_s"][0] > first["span_s"][0]
    for report in (first, second):
        assert report["steady"] is True
        assert report["window_rule"] == "met"
        assert report["answered"] > 3
        assert report["statuses"] == {"200": report["answered"]}
        assert json.loads((tmp_path / f"{report['name']}.json").read_text()) == report
    csv_a, csv_b = (tmp_path / f"{name}.requests.csv" for name in "ab")
    assert csv_a.read_text() == csv_b.read_text()
    assert load.main(["--reread", str(csv_b)]) == 0
    records = load.read_records(csv_b)
    again = method.window(records, *second["span_s"], window_s=1.0, latencies=3.0, bin_s=1.0)
    assert again["pages_per_s_by_count"] == pytest.approx(second["pages_per_s_by_count"])


def test_a_page_the_results_cache_answered_is_not_counted() -> None:
    """A page marked cached cost no engine work: its status is `cached`, not 200, so it is not
    counted and the window fails (load exits 1 on any status but 200)."""
    assert load.outcome({"text": "x", "cached": True}) == "cached"
    assert load.outcome({"error": {"message": "x"}}) == "page_error"
    assert load.outcome({"text": "x"}) == "200"
    records = [method.Record(0, 0.0, 1.0, load.outcome({"cached": True}), 9)]
    assert not any(r.ok for r in records)


def test_the_layout_api_window_reads_the_stand_ins_boxes(tmp_path: Path) -> None:
    """--api layout at the stand-in: every page answered 200 in a window of its own."""
    with ThreadedServer(layout_standin.app()) as standin:
        report = run(tmp_path, standin.url, "--concurrency", "2", "--api", "layout",
                     "--window", "1", "--latencies", "3")  # fmt: skip
    assert report["answered"] > 3
    assert report["statuses"] == {"200": report["answered"]}


def test_reread_recomputes_a_window_from_its_csv_by_its_own_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--reread NAME.requests.csv` prints the figures of NAME.json, by the rules it ran with."""
    with ThreadedServer(layout_standin.app()) as standin:
        report = run(tmp_path, standin.url, "--concurrency", "2", "--api", "layout",
                     "--window", "1", "--latencies", "3")  # fmt: skip
    assert load.main(["--reread", str(tmp_path / "w.requests.csv")]) == 0
    again = json.loads(capsys.readouterr().out)
    for key in (*method.WINDOW_KEYS, "steady", "flat", "bins"):
        assert same(again[key], report[key]), (key, again[key], report[key])


def same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative: the CSV's decimal times sum in another order than the
    run's own (a run once gave 587.573958999262 against ...2622)."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and a == pytest.approx(b, rel=1e-9)
        )
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_the_stand_in_answers_only_after_the_real_service_has(tmp_path: Path) -> None:
    """--forward: every page goes to the real service first (it sees each one), the corpus's
    boxes come back; the real service's failure is the answer (its status)."""
    real = LayoutStandin()
    with ThreadedServer(real) as service, \
            ThreadedServer(layout_standin.app(service.url)) as standin:  # fmt: skip
        report = run(tmp_path, standin.url, "--concurrency", "2", "--api", "layout",
                     "--window", "1", "--latencies", "3")  # fmt: skip
        assert report["statuses"] == {"200": report["answered"]}
        assert real.arrived.is_set()
        real.mode, real.status = "status", 503
        failed = run(tmp_path, standin.url, "--concurrency", "1", "--api", "layout",
                     "--window", "1", "--latencies", "1", "--max-seconds", "3")  # fmt: skip
    assert set(failed["statuses"]) == {"503"}
