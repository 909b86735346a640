"""`ocrvl bench sweep` against the fault fake: statuses, early stop, pages, bar, import graph."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from app.bench.commands import duration, levels
from app.bench.corpus import Page
from app.bench.load import Outcome, Plan, Shape, Target, run_level
from app.bench.progress import Progress
from app.bench.stats import summarize
from app.bench.sweep import Config, _ramp
from app.cli import main
from app.documents.resize import smart_resize
from tests.support.fake_backend import FakeVLLM


@pytest.fixture(autouse=True)
def page_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic pages go to a scratch cache, shared by this module's tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "page-cache"))


def sweep(fake: FakeVLLM, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """Run the command in-process against the fake; its exit status and sweep.json."""
    status = main(["bench", "sweep", "--url", fake.url, "--out", str(out), "--no-plot", *extra])
    return status, json.loads((out / "sweep.json").read_text())


@pytest.mark.parametrize(
    ("code", "counted_as"), [(500, "failed"), (503, "unavailable"), (429, "rate_limited")]
)
def test_a_failing_backend_stops_the_sweep_at_the_level_that_broke(
    fake: FakeVLLM, tmp_path: Path, code: int, counted_as: str
) -> None:
    """Every request failing stops the sweep after its first level; 429/503 count apart."""
    fake.mode, fake.status = "status", code
    status, report = sweep(fake, tmp_path, "--concurrency", "1,2,4", "--requests", "5")
    assert status == 1
    assert [entry["concurrency"] for entry in report["levels"]] == [1]
    level = report["levels"][0]["targets"][report["targets"][0]["label"]]
    assert level["errors"] == {str(code): 5}
    assert level[counted_as] == 5
    others = {"failed", "unavailable", "rate_limited"} - {counted_as}
    assert all(level[name] == 0 for name in others)
    assert level["error_rate"] == 1.0
    assert report["stopped"]["concurrency"] == 1
    assert f"status {code} x 5" in report["stopped"]["reason"]
    assert "**stopped**" in (tmp_path / "sweep.md").read_text()


def test_a_level_never_sends_the_same_image_twice(fake: FakeVLLM, tmp_path: Path) -> None:
    """Warm-up, measured and cancelled requests of one level all carry different pages."""
    status, report = sweep(fake, tmp_path, "--concurrency", "3", "--requests", "20")
    images = [body["messages"][0]["content"][0]["image_url"]["url"] for body in fake.bodies]
    assert status == 0
    assert len(images) >= 3 + 20
    assert len(set(images)) == len(images)
    assert report["levels"][0]["targets"][report["targets"][0]["label"]]["ok"] == 20


def test_a_level_ends_when_the_pages_run_out(fake: FakeVLLM, tmp_path: Path) -> None:
    """With fewer pages than requests the level stops early instead of repeating a page."""
    folder = tmp_path / "pages"
    folder.mkdir()
    for i in range(6):
        Image.new("RGB", (64, 64), (i * 40, 0, 0)).save(folder / f"p{i}.png")
    status, report = sweep(
        fake, tmp_path / "out", "--concurrency", "1", "--requests", "50", "--pages", str(folder),
        "--warmup", "1",
    )  # fmt: skip
    level = report["levels"][0]["targets"][report["targets"][0]["label"]]
    assert status == 0
    assert level["ended_by"] == "pages"
    assert level["requests"] == 5  # six pages, one of them the warm-up
    assert len(fake.bodies) == 6


def test_bodies_carry_ignore_eos_max_tokens_and_the_task_prompt(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """--ignore-eos, --max-tokens and --task shape every body as vLLM needs it."""
    sweep(
        fake, tmp_path, "--concurrency", "1", "--requests", "2", "--ignore-eos",
        "--max-tokens", "64", "--task", "table", "--model", "m",
    )  # fmt: skip
    body = fake.bodies[-1]
    assert body["ignore_eos"] is True
    assert body["max_completion_tokens"] == 64
    assert body["model"] == "m"
    assert body["messages"][0]["content"][1] == {"type": "text", "text": "Table Recognition:"}


def test_resized_sends_every_page_at_the_models_size(fake: FakeVLLM, tmp_path: Path) -> None:
    """--resized: the images in the bodies are the corpus's pages at smart_resize of their own
    size (what /v1/ocr sends), and the report says so."""
    status, report = sweep(fake, tmp_path, "--concurrency", "2", "--requests", "6", "--resized")
    images = [
        Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        for url in (body["messages"][0]["content"][0]["image_url"]["url"] for body in fake.bodies)
    ]
    assert status == 0
    assert len(images) >= 8
    for image in images:
        width, height = image.size
        assert image.format == "JPEG"
        assert (width % 28, height % 28) == (0, 0)
        assert smart_resize(height, width, 112_896, 1_003_520) == (height, width)  # a no-op now
    assert report["settings"]["resized"] is True
    assert "resized to the model's size" in report["settings"]["pages"]


def test_streams_measure_time_to_first_token(fake: FakeVLLM, tmp_path: Path) -> None:
    """--stream records TTFT, no later than the whole answer."""
    _, report = sweep(fake, tmp_path, "--concurrency", "2", "--requests", "6", "--stream")
    level = report["levels"][0]["targets"][report["targets"][0]["label"]]
    assert level["ok"] == 6
    assert 0 < level["ttft_s"]["p50"] <= level["latency_s"]["max"]
    assert all(body["stream_options"] == {"include_usage": True} for body in fake.bodies)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [Terminal(), io.StringIO()], ids=["tty", "pipe"])
def test_the_bar_is_drawn_only_on_a_terminal(stream: io.StringIO) -> None:
    """A terminal gets a redrawn bar; a pipe or file gets only the level's summary line."""
    bar = Progress(stream, "gw c=4", requests=10, duration=None)
    bar.drawn = -1.0
    bar.update([Outcome(0.0, 0.1, 200)] * 5)
    bar.close("done")
    text = stream.getvalue()
    if stream.isatty():
        assert "\r" in text
        assert "[" + "#" * 12 + "." * 12 + "]" in text
    else:
        assert text == "gw c=4 done\n"


def test_durations_and_levels_parse() -> None:
    """--duration takes 60s, 2m or plain seconds; --concurrency positive integers only."""
    assert [duration(t) for t in ("60s", "2m", "90", "0.5h")] == [60, 120, 90, 1800]
    assert levels("1,2,4,8") == [1, 2, 4, 8]
    for bad in ("0,1", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
            levels(bad)


def test_the_gateway_never_loads_the_load_tools() -> None:
    """Serving (app.main) and the CLI's parser load neither the sweep nor matplotlib."""
    probe = (
        "import sys, app.main, app.cli; app.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'app.bench') "
        "or m.startswith('app.bench')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['app.bench', 'app.bench.commands']"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("ramp", "spread_at_least", "spread_below"), [(0.0, 0.0, 0.05), (0.4, 0.25, 0.4)]
)
async def test_a_ramp_spreads_the_first_requests(
    ramp: float, spread_at_least: float, spread_below: float
) -> None:
    """Workers start `ramp` seconds apart in total: equal-length requests leave lock-step."""
    arrivals: list[float] = []
    all_in = asyncio.Event()  # each worker's first request has arrived

    async def answer(request: httpx.Request) -> httpx.Response:
        arrivals.append(time.perf_counter())
        if len(arrivals) == 4:
            all_in.set()
        try:  # no answer before then: no worker's second request among the first four
            await asyncio.wait_for(all_in.wait(), 60)  # generous: fails, not hangs
        except TimeoutError:
            return httpx.Response(500, json={"error": "the four workers never all sent"})
        return httpx.Response(200, json={"usage": {"completion_tokens": 1}})

    pages = iter([Page(bytes([i]), "image/png", str(i)) for i in range(8)])
    await run_level(
        lambda: httpx.AsyncClient(transport=httpx.MockTransport(answer)),
        Target("t", "http://t", "", "m"), shape=Shape(), pages=pages,
        plan=Plan(concurrency=4, warmup=0, requests=4, ramp=ramp),
    )  # fmt: skip
    assert all_in.is_set(), f"only {len(arrivals)} of the four workers sent a request"
    first = sorted(arrivals)[:4]
    assert spread_at_least <= first[-1] - first[0] < spread_below


@pytest.mark.anyio
async def test_each_worker_sends_through_a_client_of_its_own() -> None:
    """C workers, C clients, each used by one worker at a time and closed when the level ends:
    no pool shared by every request in flight (httpcore's walks all of them per request)."""
    clients: list[httpx.AsyncClient] = []
    in_flight: dict[int, int] = {}
    most: dict[int, int] = {}

    def connect() -> httpx.AsyncClient:
        index = len(clients)

        async def answer(request: httpx.Request) -> httpx.Response:
            in_flight[index] = in_flight.get(index, 0) + 1
            most[index] = max(most.get(index, 0), in_flight[index])
            await asyncio.sleep(0.01)
            in_flight[index] -= 1
            return httpx.Response(200, json={"usage": {"completion_tokens": 3}})

        clients.append(httpx.AsyncClient(transport=httpx.MockTransport(answer)))
        return clients[-1]

    pages = iter([Page(bytes([i]), "image/png", str(i)) for i in range(40)])
    run = await run_level(
        connect, Target("t", "http://t", "", "m"), shape=Shape(), pages=pages,
        plan=Plan(concurrency=5, warmup=5, requests=20),
    )  # fmt: skip
    assert len(run.outcomes) >= 20
    assert all(outcome.ok and outcome.tokens == 3 for outcome in run.outcomes)
    assert len(clients) == 5
    assert most == dict.fromkeys(range(5), 1)
    assert all(client.is_closed for client in clients)


def test_the_automatic_ramp_is_about_one_latency_at_the_new_level() -> None:
    """Level 2's ramp: level 1's mean latency times the concurrency ratio, at most 30 s."""
    config = Config(urls=["u"], keys=[""], labels=["t"], levels=[8, 16])
    done = [{"targets": {"t": {"concurrency": 8, "latency_s": {"avg": 2.0}}}}]
    assert _ramp(config, [], "t", 8) == 0.0
    assert _ramp(config, done, "t", 16) == 4.0
    assert _ramp(config, done, "t", 1024) == 30.0
    assert (
        _ramp(Config(urls=["u"], keys=[""], labels=["t"], levels=[8], ramp=1.5), done, "t", 16)
        == 1.5
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("block", "late_at_least", "late_below"), [(0.0, 0.0, 0.1), (0.2, 0.15, 1.0)]
)
async def test_the_load_generators_own_lateness_is_measured(
    block: float, late_at_least: float, late_below: float
) -> None:
    """A load generator whose loop is busy delays its own sends and reads; the level says how
    late its loop ran. Here each answer's handling blocks the loop for `block` seconds."""

    async def answer(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.1)
        return httpx.Response(200, json={"usage": {"completion_tokens": 1}})

    def busy(outcomes: list[Outcome]) -> None:
        time.sleep(block)  # a loop busy with something else: parsing, another task's work

    pages = iter([Page(bytes([i]), "image/png", str(i)) for i in range(12)])
    run = await run_level(
        lambda: httpx.AsyncClient(transport=httpx.MockTransport(answer)),
        Target("t", "http://t", "", "m"), shape=Shape(), pages=pages,
        plan=Plan(concurrency=2, warmup=0, requests=8), progress=busy,
    )  # fmt: skip
    assert run.loop_lags
    assert late_at_least <= max(run.loop_lags) < late_below
    level = summarize(run, 2, None)
    assert level["load_generator"]["loop_lag_s"]["max"] == max(run.loop_lags)
