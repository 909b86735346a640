"""bench.gpu.samplers: what a /metrics text keeps, and a window's engine and GPU figures."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bench.gpu import samplers

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.05
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {done}
vllm:request_success_created{{engine="0",finished_reason="length",model_name="m"}} 1.7e9
vllm:e2e_request_latency_seconds_bucket{{engine="0",le="10.0",model_name="m"}} {done}
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {e2e}
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {done}
python_gc_objects_collected_total{{generation="0"}} 12.0
"""


def test_a_metrics_text_keeps_samples_and_drops_buckets_but_the_layout_service_s() -> None:
    """vLLM's and the gateway's samples stay, without histogram buckets or _created; the layout
    service's buckets stay (its batch sizes); comments and other metrics go."""
    text = VLLM.format(running=3, done=10, e2e=50) + (
        'ocrvl_layout_batch_size_bucket{le="8.0"} 4.0\n'
        'ocrvl_request_duration_seconds_bucket{le="1.0",route="/v1/chat/completions"} 2.0\n'
        'ocrvl_request_duration_seconds_sum{route="/v1/chat/completions"} 20.0\n'
    )
    kept = samplers.kept(text).splitlines()
    assert 'ocrvl_layout_batch_size_bucket{le="8.0"} 4.0' in kept
    assert 'ocrvl_request_duration_seconds_sum{route="/v1/chat/completions"} 20.0' in kept
    assert not [
        line for line in kept if "vllm:" in line and ("_bucket" in line or "_created" in line)
    ]
    assert not [line for line in kept if line.startswith(("#", "python_"))]
    assert len([line for line in kept if line.startswith("vllm:")]) == 6


def test_the_engine_s_window_counts_what_vllm_finished_and_its_phases(tmp_path: Path) -> None:
    """Samples every 2 s, 5 pages finishing per second at 10 s each, 40 running: over [4, 16]
    vLLM finished 5/s, 40 ran on average, a page spent 10 s end to end; a sample where one URL
    did not answer is left out of the sums."""
    path = tmp_path / "m.jsonl"
    with path.open("w") as out:
        for t in range(0, 21, 2):
            text = samplers.kept(VLLM.format(running=40, done=5 * t, e2e=50 * t))
            texts = {"http://e/metrics": None if t == 10 else text}
            out.write(json.dumps({"t": t, "texts": texts}) + "\n")
    window = samplers.engine_window(path, 4.0, 16.0)
    assert window is not None
    assert window["finished_per_s"] == pytest.approx(5.0)
    assert window["running_mean"] == pytest.approx(40.0)
    assert window["samples"] == 6  # 4, 6, 8, 12, 14, 16
    assert window["phases"]["mean_s"]["vllm"] == pytest.approx(10.0)
    assert samplers.engine_window(tmp_path / "missing.jsonl", 0, 1) is None


def test_the_gpu_s_window_averages_nvidia_smi_s_rows_inside_it(tmp_path: Path) -> None:
    """Rows 1 s apart from the load's start: only those inside [2, 5] count, per GPU."""
    began = datetime(2026, 12, 2, 10, 0, 0)
    rows = []
    for second in range(8):
        stamp = (began + timedelta(seconds=second)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        rows.append(f"{stamp}, 0, {10 * second}, {1000 + second}")
    path = tmp_path / "g.csv"
    path.write_text("\n".join(rows) + "\n")
    found = samplers.gpu_window(path, began.timestamp(), 2.0, 5.0)
    assert found == {"0": {"samples": 4, "busy_mean_pct": 35.0, "busy_max_pct": 50.0,
                           "memory_max_mib": 1005.0}}  # fmt: skip


def layout_text(passes: int, pages: int, forward_s: float, small: int) -> str:
    """The layout service's /metrics (kept lines): `small` of the passes had one page."""
    buckets = {"1.0": small, "2.0": small, "4.0": small, "8.0": passes, "+Inf": passes}
    lines = [f'ocrvl_layout_batch_size_bucket{{le="{le}"}} {n}' for le, n in buckets.items()]
    return "\n".join([*lines, f"ocrvl_layout_batch_size_count {passes}",
                      f"ocrvl_layout_batch_size_sum {pages}",
                      f"ocrvl_layout_forward_seconds_sum {forward_s}",
                      f"ocrvl_layout_forward_seconds_count {passes}",
                      f"ocrvl_layout_queue_wait_seconds_sum {pages * 0.004}",
                      f"ocrvl_layout_queue_wait_seconds_count {pages}"])  # fmt: skip


def test_the_layout_service_s_window_gives_its_batches_and_ms_per_page(tmp_path: Path) -> None:
    """Between the samples at 2 s and 12 s: 100 passes of 700 pages (7 a batch), 2 of them of
    one page, 98 of 5-8; forward 3 ms a page; 4 ms of queue wait on average."""
    path = tmp_path / "m.jsonl"
    url = "http://127.0.0.1:8300/metrics"
    with path.open("w") as out:
        for t, (passes, pages, forward, small) in {0: (0, 0, 0.0, 0), 2: (10, 40, 0.12, 5),
                                                   12: (110, 740, 2.22, 7)}.items():  # fmt: skip
            text = samplers.kept(layout_text(passes, pages, forward, small))
            out.write(json.dumps({"t": t, "texts": {url: text}}) + "\n")
    found = samplers.layout_window(path, 2.0, 12.0)
    assert found is not None
    assert (found["forward_passes"], found["pages"], found["mean_batch"]) == (100, 700, 7)
    assert found["batches_by_size"] == {"<= 1": 2, "<= 2": 0, "<= 4": 0, "<= 8": 98}
    assert found["forward_ms_per_page"] == pytest.approx(3.0)
    assert found["queue_wait_ms_mean"] == pytest.approx(4.0)
