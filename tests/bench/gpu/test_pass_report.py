"""bench.gpu.pass_report on a results folder made to order: windows, floor lines, py-spy tails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import pass_report


def window(c: int | None, per_s: float, p99: float, *, steady: bool = True) -> dict[str, Any]:
    """A steady window's report as bench.gpu.steady writes it (the fields the report reads)."""
    latency = c / per_s if c else 4.0
    return {
        "loop": "closed" if c else "open",
        "figures": {
            "seconds": 130.0, "latencies_held": 130.0 / latency, "steady": steady,
            "answered": int(per_s * 130), "statuses": {"200": int(per_s * 130)},
            "pages_per_s_count": per_s * 0.98, "pages_per_s_little": per_s,
            "pages_per_s_c_over_latency": per_s if c else None,
            "latency_s": {"mean": latency, "p50": latency, "p99": p99, "max": p99},
        },
        "engine": {"finished_per_s": per_s * 0.99},
        "gpu": {"0": {"busy_mean_pct": 60.0, "samples": 130}},
    }  # fmt: skip


def floor_line(mode: str, ms: float) -> dict[str, Any]:
    return {
        "rotary": mode, "rotary_kernel": mode, "floor_ms_per_page": ms,
        "floor_pages_per_s": 1000 / ms, "encoder": {"ms_per_page": ms - 6},
        "prefill_ms_per_page": 3.0, "decode": {"ms_per_page": 3.0},
    }  # fmt: skip


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """The pass's order: stock and plugin closed at 256, open at one rate (B A), the default
    closed at 512 and 256; floor lines 29.2 (unfused) and 22.7 ms (fused)."""
    runs = {
        "01-stock-c256": window(256, 25.0, 12.0), "02-plugin-c256": window(256, 35.0, 9.0),
        "03-plugin-r20": window(None, 20.0, 5.0), "04-stock-r20": window(None, 20.0, 7.0),
        "05-default-c512": window(512, 41.0, 16.0), "06-default-c256": window(256, 38.0, 8.0),
    }  # fmt: skip
    for name, report in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    (tmp_path / "01-stock-c256.requests.csv").write_text("not a report\n")
    (tmp_path / "floor").mkdir()
    for mode, ms in (("unfused", 29.2), ("fused", 22.7)):
        (tmp_path / "floor" / f"floor-{mode}.json").write_text(json.dumps(floor_line(mode, ms)))
    spy = tmp_path / "spy-06-default-c256"
    spy.mkdir()
    (spy / "threads-101500.txt").write_text(
        "    PID     TID %CPU COMMAND ARGS\n"
        "   4242    4242 98.0 python3 VLLM::EngineCore\n"
        "   4243    4243  0.0 python3 VLLM::EngineCore\n"
        "   4300    4300 40.0 python3 python3 -m vllm.entrypoints.cli.main serve\n"
    )
    loop = "run_busy_loop (core.py:1);step (core.py:2)"
    encoder = (  # three frames of one stack match the encoder: still 300 samples, not 900
        f"{loop};execute_model (runner.py:2);_process_image_input (paddleocr_vl.py:3);"
        "embed_multimodal (model.py:4);PackedEncoder.encode (encoder.py:5)"
    )
    (spy / "spy-101500-4242.txt").write_text(
        f"{encoder} 300\n{loop};Scheduler.schedule (scheduler.py:9) 150\n"
        f"{loop};execute_model (runner.py:2);sample (sampler.py:7) 150\n"
        "Thread._bootstrap (threading.py:1);wait (threading.py:2) 400\n"  # a helper thread
    )
    (spy / "spy-101500-4243.txt").write_text("")  # the idle engine beside the measured one
    (spy / "spy-101500-4300.txt").write_text("serve (api.py:1);render (api.py:2) 900\n")
    return tmp_path


def test_the_report_lists_every_window_in_order_against_each_floor_line(
    results: Path, tmp_path: Path
) -> None:
    """Six windows in the order they ran, each with its pages/s as a fraction of both floor
    lines; the floor table and the window table in the markdown."""
    assert pass_report.main(["report", str(results), "--out", str(tmp_path / "o"),
                             "--stem", "p"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "o" / "p.json").read_text())
    rows = report["rows"]
    assert [(r["order"], r["layout"], r["load"]) for r in rows] == [
        (1, "stock", "c256"), (2, "plugin", "c256"), (3, "plugin", "r20"), (4, "stock", "r20"),
        (5, "default", "c512"), (6, "default", "c256"),
    ]  # fmt: skip
    assert rows[4]["x_floor"]["fused"] == pytest.approx(41.0 * 22.7 / 1000)
    assert rows[4]["x_floor"]["unfused"] == pytest.approx(41.0 * 29.2 / 1000)
    text = (tmp_path / "o" / "p.md").read_text()
    assert "| unfused |" in text
    assert "| 5 | default | c512 |" in text


def test_the_targets_are_decided_on_c_over_mean_latency(results: Path, tmp_path: Path) -> None:
    """plugin/stock at the same C: 35/25 = 1.4x, met; the default's best 41 pages/s against
    the fused floor's 44.05: 93 %, met; its knee is c256 (38 >= 90 % of 41), p99 there 8 s."""
    pass_report.report(results, tmp_path, "p", ["stock", "plugin"], "default")
    targets = json.loads((tmp_path / "p.json").read_text())["targets"]
    assert targets["plugin_over_stock"]["ratio"] == pytest.approx(1.4)
    assert targets["plugin_over_stock"]["met"] is True
    assert targets["plugin_over_stock"]["at"] == "c256"
    default = targets["default_over_fused_floor"]
    assert default["ratio"] == pytest.approx(41.0 / (1000 / 22.7))
    assert default["met"] is True
    assert (default["knee"], default["p99_at_knee_s"]) == ("c256", 8.0)


def test_a_tail_s_py_spy_gives_the_engine_core_s_busy_and_encoder_shares(
    results: Path, tmp_path: Path
) -> None:
    """The loaded EngineCore's file (picked by its pid in the threads file; the API server's
    left out, the idle engine's empty file counted apart, not divided by): 600 main-loop samples
    of 1,000 ticks busy, 300 of them in the vision encoder (a stack once, however many of its
    frames are the encoder's), 150 scheduling; the helper thread's 400 are not the loop's."""
    pass_report.report(results, tmp_path, "p", ["stock", "plugin"], "default")
    spy = json.loads((tmp_path / "p.json").read_text())["spy"]
    shares = {"busy_of_time": 0.6, "encoder_of_time": 0.3, "encoder_of_busy": 0.5,
              "schedule_of_busy": 0.25}  # fmt: skip
    assert spy == {"6": {"files": 1, "idle_files": 1, **shares, "engines": {"4242": shares}}}


def test_the_open_loop_rate_is_a_fraction_of_the_slowest_pair_layout(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.8 of min(25, 35) closed-loop pages/s: 20.0, printed for pass.sh."""
    assert pass_report.main(["rate", str(results), "--layouts", "stock,plugin"]) == 0
    assert capsys.readouterr().out.strip() == "20.0"
    assert pass_report.common_rate(results, ["default"], 0.5) == pytest.approx(19.0)


def test_a_b_b_a_averages_each_layout_s_windows_at_the_same_c(
    results: Path, tmp_path: Path
) -> None:
    """Stock 25 then 27, plugin 35 then 33 at c256 (A B B A): (35 + 33) / (25 + 27), each
    window named; an unsteady window is left out when a steady one of its layout is there."""
    (results / "07-plugin-c256.json").write_text(json.dumps(window(256, 33.0, 9.0)))
    (results / "08-stock-c256.json").write_text(json.dumps(window(256, 27.0, 12.0)))
    (results / "09-stock-c256.json").write_text(json.dumps(window(256, 5.0, 99.0, steady=False)))
    pass_report.report(results, tmp_path, "p", ["stock", "plugin"], "default")
    target = json.loads((tmp_path / "p.json").read_text())["targets"]["plugin_over_stock"]
    assert target["ratio"] == pytest.approx(68 / 52)
    assert (target["stock_windows"], target["plugin_windows"]) == ([1, 8], [2, 7])
    assert target["met"] is True
    assert target["steady"] is True


def test_the_layout_stage_s_share_of_a_page_s_gpu_time(results: Path, tmp_path: Path) -> None:
    """Issue 36: the service's 2.0 ms per page against the fused floor's 22.7 ms: 2.0 / 24.7 =
    8.1 %, met (<= 10 %); the better of a layout's two windows counts."""
    for name, ms in (("07-layout-c64", 4.0), ("08-layout-c64", 2.0)):
        report = window(64, 400.0, 0.2) | {"layout_service": {"forward_ms_per_page": ms,
                                                              "mean_batch": 20.0}}  # fmt: skip
        (results / f"{name}.json").write_text(json.dumps(report))
    pass_report.report(results, tmp_path, "p", ["stock", "plugin"], "default")
    target = json.loads((tmp_path / "p.json").read_text())["targets"]
    share = target["layout_of_page_gpu_time (layout)"]
    assert share["ratio"] == pytest.approx(2.0 / 24.7)
    assert (share["window"], share["met"], share["mean_batch"]) == (8, True, 20.0)
    assert "**layout_of_page_gpu_time (layout)** (target 0.1)" in (tmp_path / "p.md").read_text()
