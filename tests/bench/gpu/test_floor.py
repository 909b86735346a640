"""bench.gpu.floor on the CPU: the project's model config with shrunken sizes, timed for real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("torch", reason=ENGINE_ONLY)

from bench.gpu import floor, layouts  # noqa: E402  (torch first: it lives in the engine venv)

HEY_MPS = Path(__file__).resolve().parents[3] / "bench/results/gpu-h200-2026-12-01-hey-raw/call-b"

SHRUNK = {
    "vision_config": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                      "intermediate_size": 96},
    "text_config": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 192,
                    "vocab_size": 300},
}  # fmt: skip


def shrunk_config(tmp_path: Path) -> Path:
    """The shipped config.json with every size made small and its other keys kept."""
    config = json.loads(floor.CONFIG.read_text())
    for section, sizes in SHRUNK.items():
        config[section] |= sizes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the command line on a 16-visual-token page, 8 output tokens, 4 sequences."""
    tmp = tmp_path_factory.mktemp("floor")
    argv = ["--config", str(shrunk_config(tmp)), "--visual-tokens", "16", "--output-tokens",
            "8", "--batch", "4", "--encoder-batches", "1,2", "--repeat", "3", "--device", "cpu",
            "--out", str(tmp)]  # fmt: skip
    assert floor.main(argv) == 0
    result: dict[str, Any] = json.loads((tmp / "floor.json").read_text())
    return result


def test_the_report_names_the_page_the_shapes_and_the_machine(report: dict[str, Any]) -> None:
    """floor.json records the page asked for, the config's shapes and where it ran."""
    assert report["tool"] == "bench.gpu.floor"
    assert report["page"] == {"visual_tokens": 16, "patches": 64, "prompt_tokens": 26,
                              "output_tokens": 8, "pixels": None}  # fmt: skip
    assert report["shapes"]["v_layers"] == 2
    assert report["shapes"]["t_kv_heads"] == 2
    assert report["shapes"]["patch"] == 14
    assert report["shapes"]["merge"] == 2
    assert report["machine"]["device"] == "cpu"
    assert report["cuda_graphs"] is False
    assert report["decode"]["batch"] == 4
    assert report["decode"]["context"] == 26 + 4  # prompt + half the output


def test_every_stage_took_time(report: dict[str, Any]) -> None:
    """Each encoder batch, the prefill and the decode step have a positive median time."""
    assert [row["pages"] for row in report["encoder"]["per_batch"]] == [1, 2]
    for row in report["encoder"]["per_batch"]:
        assert row["ms_per_call"] > 0
        assert row["ms_per_page"] == pytest.approx(row["ms_per_call"] / row["pages"])
    assert report["prefill_ms_per_page"] > 0
    assert report["decode"]["step_ms"] > 0
    assert report["encoder"]["tflop_per_page"] > 0


def test_the_floor_is_encoder_plus_prefill_plus_a_share_of_the_decode_steps(
    report: dict[str, Any],
) -> None:
    """floor = best encoder ms per page + prefill + decode step x output tokens / batch."""
    encoder = report["encoder"]
    assert encoder["ms_per_page"] == min(row["ms_per_page"] for row in encoder["per_batch"])
    decode = report["decode"]
    assert decode["ms_per_page"] == pytest.approx(decode["step_ms"] * 8 / 4)
    floor_ms = encoder["ms_per_page"] + report["prefill_ms_per_page"] + decode["ms_per_page"]
    assert report["floor_ms_per_page"] == pytest.approx(floor_ms)
    assert report["floor_pages_per_s"] == pytest.approx(1000 / floor_ms)


def test_a_page_given_in_pixels_gets_the_model_s_resize() -> None:
    """1240x1754 pixels resize (max 1,003,520 pixels, factor 28) to 840x1176: 30 x 42 tokens."""
    shapes = floor.Shapes.read(floor.CONFIG)
    args = floor.parser().parse_args(["--pixels", "1240x1754", "--output-tokens", "64"])
    page = floor.page_of(shapes, args)
    assert (page.visual_tokens, page.patches, page.prompt_tokens) == (1260, 5040, 1270)
    assert (page.output_tokens, page.pixels) == (64, "1240x1754")


def test_the_encoder_flop_count_matches_the_standard_page() -> None:
    """A 5,120-patch page costs ~7.5 TFLOP in the full-size encoder (../shared/MEASURED.md
    gives 7.47 for the layers; the patch embedding and projector add under 1 %)."""
    tflop = floor.encoder_tflop(floor.Shapes.read(floor.CONFIG), 5120)
    assert 7.47 <= tflop <= 7.47 * 1.01


def test_merged_layouts_state_their_pages_per_s_as_a_fraction_of_the_floor(
    report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seventh H200 pass's MPS call merged beside a floor.json: the floor in the merged
    JSON, each layout's sweep peak and hey pages/s divided by it, and the table saying so."""
    results = tmp_path / "results"
    shutil.copytree(HEY_MPS, results, ignore=shutil.ignore_patterns("*.csv", "*.md"))
    (results / "floor.json").write_text(json.dumps(report))
    monkeypatch.setattr(layouts, "RESULTS", results)
    assert layouts.merge(tmp_path / "out", ["one-mps", "two-mps"], stem="m") == 0
    merged = json.loads((tmp_path / "out" / "m.json").read_text())
    per_s = report["floor_pages_per_s"]
    assert merged["floor"]["floor_pages_per_s"] == per_s
    for row in merged["layouts"]:
        assert row["peak_x_floor"] == pytest.approx(row["peak_pages_per_s"] / per_s)
        assert row["hey_x_floor"] == pytest.approx(row["hey"]["pages_per_s"] / per_s)
        assert row["knee_concurrency"] == 512  # the call's one level
        assert 0 < row["p50_at_knee_s"] <= row["p99_at_knee_s"]
    against = (tmp_path / "out" / "m.md").read_text().split("Against the floor")[1]
    two = next(line for line in against.splitlines() if line.startswith("| two-mps |"))
    cells = [cell.strip() for cell in two.split("|")[1:-1]]
    assert cells[4] == "41.77"  # hey through the gateway, as docs/benchmarks.md quotes it
    hey = next(row["hey"]["pages_per_s"] for row in merged["layouts"] if row["layout"] == "two-mps")
    assert cells[5] == f"{hey / per_s:.0%}"
    assert cells[6] == "1.55"  # hey against one-mps's hey (26.97)
