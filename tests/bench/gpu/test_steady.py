"""bench.gpu.steady against a stand-in backend whose every answer takes a fixed time (the input
fixed, so the pages/s each loop must read is known), and its raw file against its report."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from app.bench.corpus import Page
from bench.gpu import method, steady
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import serving

SERVICE_S = 0.25  # the stand-in's time per answer


def pages(count: int) -> list[Page]:
    """Small distinct PNG pages."""
    made = []
    for index in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (28, 28), (index * 40 % 256, 0, 0)).save(buffer, format="PNG")
        made.append(Page(buffer.getvalue(), "image/png", f"p{index}.png"))
    return made


def run(tmp_path: Path, url: str, *options: str) -> dict[str, Any]:
    args = steady.parser().parse_args(
        [url, "--name", "run", "--out", str(tmp_path), "--window", "3", "--latencies", "5",
         "--max-seconds", "30", *options]
    )  # fmt: skip
    return asyncio.run(steady.measure(args, pages(5)))


@pytest.fixture
def backend() -> Any:
    with serving(FakeVLLM(delay=SERVICE_S)) as fake:
        yield fake


def test_a_closed_loop_reads_c_over_the_service_time_and_its_raw_file_gives_the_same(
    tmp_path: Path, backend: FakeVLLM
) -> None:
    """4 clients ramped over 0.5 s against 0.25 s answers: at most 16 pages/s, the same by count
    and by Little's law; the window starts after the ramp and every client's first answer and
    holds the 3 s and 5 latencies asked; every request is in the CSV (the ones the end cut short
    as cancelled), and the report's figures are what bench.gpu.method computes from that CSV."""
    report = run(tmp_path, backend.url, "--concurrency", "4", "--ramp", "0.5")
    f = report["figures"]
    assert report["loop"] == "closed"
    assert report["target"]["model"] == backend.served
    assert f["statuses"] == {"200": f["answered"]}
    assert f["steady"] is True
    assert f["seconds"] >= 3.0
    assert f["latencies_held"] >= 5
    # at most C over the stand-in's time (a busy machine only adds latency), and what the
    # window counted is what Little's law gives from the same requests
    assert f["latency_s"]["p50"] >= SERVICE_S
    assert f["pages_per_s_count"] <= 4 / SERVICE_S * 1.05
    assert f["pages_per_s_little"] == pytest.approx(f["pages_per_s_count"], rel=0.15)
    assert f["pages_per_s_c_over_latency"] == pytest.approx(f["pages_per_s_little"], rel=0.05)
    assert f["window_s"][0] >= max(method.ramp(4, 0.5)) + SERVICE_S  # the last client answered
    records = steady.read_records(tmp_path / "run.requests.csv")
    assert len(records) == report["requests"]
    assert 0 < sum(r.status == method.CANCELLED for r in records) <= 4
    assert {r.worker for r in records} == {0, 1, 2, 3}
    again = method.figures(records, *f["window_s"], concurrency=4, window=3, latencies=5)
    for key in ("answered", "pages_per_s_count", "statuses", "steady"):
        assert again[key] == f[key]
    assert again["pages_per_s_little"] == pytest.approx(f["pages_per_s_little"], rel=1e-3)
    assert json.loads((tmp_path / "run.json").read_text())["figures"]["answered"] == f["answered"]


def test_an_open_loop_offers_the_rate_asked_and_counts_what_it_answered(
    tmp_path: Path, backend: FakeVLLM
) -> None:
    """Poisson arrivals at 12/s against 0.25 s answers: requests start at ~12/s whatever the
    stand-in's speed on a busy machine, every one is answered 200, and the window's figures are
    bench.gpu.method's over the CSV (no C: the mean in flight is measured, not assumed)."""
    report = run(tmp_path, backend.url, "--rate", "12", "--settle", "2")
    f = report["figures"]
    assert report["loop"] == "open"
    assert f["statuses"] == {"200": f["answered"]}
    assert f["pages_per_s_c_over_latency"] is None
    records = steady.read_records(tmp_path / "run.requests.csv")
    assert all(r.worker == -1 for r in records)
    starts = sorted(r.start for r in records)
    assert (len(starts) - 1) / (starts[-1] - starts[0]) == pytest.approx(12, rel=0.35)
    assert f["in_flight_mean"] >= 12 * SERVICE_S * 0.5  # each answer takes the stand-in's time
    again = method.figures(records, *f["window_s"], window=3, latencies=5)
    assert again["answered"] == f["answered"]
    assert again["pages_per_s_little"] == pytest.approx(f["pages_per_s_little"])


def test_the_tail_runs_its_command_past_the_window_with_the_load_still_on(
    tmp_path: Path, backend: FakeVLLM
) -> None:
    """--tail-command runs once the window is decided, the load going on for --tail-seconds:
    answers keep coming after the window's end, and none of them is in its figures."""
    marker = tmp_path / "tail-ran"
    report = run(tmp_path, backend.url, "--concurrency", "2", "--ramp", "0.2",
                 "--tail-seconds", "1", "--tail-command", f"touch {marker}")  # fmt: skip
    assert marker.exists()
    end = report["figures"]["window_s"][1]
    records = steady.read_records(tmp_path / "run.requests.csv")
    assert any(r.ok and r.end > end + 0.5 for r in records)


def test_pages_are_cycled_in_a_seeded_order() -> None:
    """Each pass through the corpus is a fresh shuffle of all of it; the seed fixes the order."""
    corpus = pages(5)
    drawn = [page.name for page, _ in zip(steady.cycled(corpus, 3), range(15), strict=False)]
    for chunk in (drawn[:5], drawn[5:10], drawn[10:]):
        assert sorted(chunk) == sorted(page.name for page in corpus)
    again = [page.name for page, _ in zip(steady.cycled(corpus, 3), range(15), strict=False)]
    assert drawn == again
