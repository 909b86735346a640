"""bench.gpu.layout_kernels on the CPU against the tiny PP-DocLayoutV3: the JSON doc_report
reads, its timer saying it is no GPU time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("transformers", reason=ENGINE_ONLY)

from bench.gpu import layout_kernels  # noqa: E402
from tests.support.layout_service import tiny_layout_dir  # noqa: E402


def test_each_batch_size_gets_its_wall_and_op_time_per_pass_and_page(tmp_path: Path) -> None:
    out = tmp_path / "layout-kernels.json"
    argv = ["--batches", "1,2", "--repeat", "2", "--device", "cpu", "--out", str(out)]
    assert layout_kernels.main([str(tiny_layout_dir()), *argv]) == 0
    made = json.loads(out.read_text())
    assert (made["device"], made["gpu"], made["dtype"], made["compile"]) == (
        "cpu", None, "float32", False)  # fmt: skip
    assert made["timer"] == "cpu-ops"
    assert made["repeat"] == 2
    assert len(made["input"]) == 2
    assert made["warm_up_s"] > 0
    assert set(made["batches"]) == {"1", "2"}
    for size, line in made["batches"].items():
        assert line["event_ms_per_pass"] is None  # no CUDA events on the CPU
        assert line["kernel_ms_per_pass"] > 0
        assert line["kernels_per_pass"] > 0
        assert line["kernel_ms_per_page"] == pytest.approx(line["kernel_ms_per_pass"] / int(size))
        assert line["wall_ms_per_page"] == pytest.approx(line["wall_ms_per_pass"] / int(size))
