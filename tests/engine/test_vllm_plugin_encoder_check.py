"""bench.gpu.encoder_check on the CPU with the tiny checkpoint, as CI runs it (the H200 runs the
same code on the full-size checkpoint in bfloat16)."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY, tiny_model_dir

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason=ENGINE_ONLY)

with warnings.catch_warnings():  # torch's own DeprecationWarnings (torch.jit) on vLLM's import
    warnings.simplefilter("ignore", DeprecationWarning)
    import ocrvl_vllm_plugin.model  # noqa: F401  (vLLM's model code, which encoder_check imports late)

    from bench.gpu import encoder_check


def run(tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """The command line on two mixed batches; its exit status and its JSON."""
    out = tmp_path / "check" / "encoder-check.json"
    argv = ["--device", "cpu", "--tiny", str(tiny_model_dir()), "--batches", "1,7",
            "--repeat", "1", "--out", str(out), *extra]  # fmt: skip
    status = encoder_check.main(argv)
    return status, json.loads(out.read_text())


def test_the_report_compares_and_times_both_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per batch: the images and their grids, the distance (within float32's bound), both
    classes' times; the machine and the kernels; a table on stdout; exit 0."""
    status, report = run(tmp_path)
    assert status == 0
    assert report["tool"] == "bench.gpu.encoder_check"
    assert (report["model"]["kind"], report["dtype"]) == ("tiny", "float32")
    assert report["machine"]["device"] == "cpu"
    assert (report["attention"], report["fused_rotary"]) == ("TORCH_SDPA", False)
    assert [row["images"] for row in report["batches"]] == [1, 7]
    for row in report["batches"]:
        assert len(row["grids"]) == row["images"]
        assert row["patches"] == sum(t * h * w for t, h, w in row["grids"])
        assert row["tokens"] == row["patches"] // 4
        assert row["max_rel"] <= row["bound_rel"] == encoder_check.REL_FP32
        assert row["within"] is True
        assert row["stock_ms"] > 0
        assert row["plugin_ms"] > 0
        assert row["speedup"] == pytest.approx(row["stock_ms"] / row["plugin_ms"])
    assert report["within"] is True
    printed = capsys.readouterr().out
    assert "all within bounds" in printed
    assert "stock ms" in printed


def test_a_batch_out_of_bounds_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bound no difference can meet (below zero) marks every batch and exits 1."""
    monkeypatch.setattr(encoder_check, "REL_FP32", -1.0)
    status, report = run(tmp_path)
    assert status == 1
    assert report["within"] is False
    assert not any(row["within"] for row in report["batches"])


def test_batches_mix_pages_min_pixel_blocks_and_other_blocks() -> None:
    """A batch of 12 holds two pages, two blocks at PaddleX's min_pixels and other blocks,
    every grid as vLLM resizes images (even sides, within PaddleX's pixel limits)."""
    grids = encoder_check.batch_grids(12, random.Random(0))
    page, block = encoder_check.grid_of(*encoder_check.PAGE), (1, 24, 24)
    assert grids.count(page) >= 2
    assert grids.count(block) >= 2
    for _, h, w in grids:
        assert h % 2 == w % 2 == 0
        pixels = h * w * 14 * 14
        assert encoder_check.MIN_PIXELS <= pixels <= encoder_check.MAX_PIXELS


def test_each_vit_attention_mode_is_checked_and_timed_on_pages_and_on_blocks(
    tmp_path: Path,
) -> None:
    """`--kinds pages,blocks --attention sdpa,grouped` (issue 50's measurement): a batch of each
    kind, every mode within the fp32 bound of vLLM's embeddings and timed; pages only whole
    pages, blocks no page; the table names each mode."""
    status, report = run(tmp_path, "--kinds", "pages,blocks", "--attention", "sdpa,grouped")
    assert status == 0
    assert [row["kind"] for row in report["batches"]] == ["pages", "pages", "blocks", "blocks"]
    page = list(encoder_check.grid_of(*encoder_check.PAGE))
    for row in report["batches"]:
        assert set(row["modes"]) == {"sdpa", "grouped"}
        for mode in row["modes"].values():
            assert mode["within"] is True
            assert mode["max_rel"] <= encoder_check.REL_FP32
            assert mode["ms"] > 0
        assert (page in row["grids"]) is (row["kind"] == "pages")
    assert report["stock_attention"] == "TORCH_SDPA"
