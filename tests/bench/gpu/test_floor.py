"""bench.gpu.floor on the CPU: the project's model config with shrunken sizes, timed for real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("torch", reason=ENGINE_ONLY)

from bench.gpu import floor  # noqa: E402  (torch first: it lives in the engine venv)
from bench.gpu.floor_model import Shapes, encoder_tflop  # noqa: E402

SHRUNK = {
    "vision_config": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                      "intermediate_size": 96},
    "text_config": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 192,
                    "vocab_size": 300},
}  # fmt: skip
# two pages: one read whole (16 visual tokens, 8 output), one as two blocks (16 and 4 tokens)
WORK = {"whole": [[[16, 8]], [[16, 8]]], "blocks": [[[16, 4], [4, 4]], [[4, 8]]]}


def run(tmp_path: Path, variant: str) -> dict[str, Any]:
    """The command line on WORK's `variant`, shrunk config, 4 sequences per decode step."""
    config = json.loads(floor.CONFIG.read_text())
    for section, sizes in SHRUNK.items():
        config[section] |= sizes
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "work.json").write_text(json.dumps(WORK))
    argv = ["--work", str(tmp_path / "work.json"), "--variant", variant, "--config",
            str(tmp_path / "config.json"), "--device", "cpu", "--batch", "4", "--repeat", "2",
            "--encoder-batches", "1,2", "--out", str(tmp_path)]  # fmt: skip
    assert floor.main(argv) == 0
    return dict(json.loads((tmp_path / f"floor-{variant}.json").read_text()))


@pytest.mark.parametrize("variant", ["whole", "blocks"])
def test_the_floor_is_the_definitions_sum_for_each_variant(tmp_path: Path, variant: str) -> None:
    """One rule for both variants: per page the sum over its requests of the encoder (best
    batch) and the prefill at its size, plus the decode step x its output tokens / batch; the
    mean over pages; each distinct size timed once; the definition says the rotary is out."""
    report = run(tmp_path, variant)
    sizes, step = report["sizes"], report["decode"]["step_ms"]
    assert set(sizes) == {str(v) for page in WORK[variant] for v, _ in page}
    for row in sizes.values():
        assert row["encoder_ms"] == min(row["encoder_ms_by_batch"].values()) > 0
        assert row["prefill_ms"] > 0
    pages = [sum(sizes[str(v)]["encoder_ms"] + sizes[str(v)]["prefill_ms"] for v, _ in page)
             + step * sum(o for _, o in page) / 4 for page in WORK[variant]]  # fmt: skip
    assert report["ms_per_page"] == pytest.approx(sum(pages) / len(pages))
    assert report["definition"] == floor.DEFINITION
    assert "rotary left out" in floor.DEFINITION
    assert report["requests_per_page"] == sum(len(page) for page in WORK[variant]) / 2
    assert report["machine"]["device"] == "cpu"


def test_the_encoder_flop_count_matches_the_standard_page() -> None:
    """A 5,120-patch page costs ~7.5 TFLOP in the full-size encoder (../shared/MEASURED.md
    quotes 7.47)."""
    assert encoder_tflop(Shapes.read(floor.CONFIG), 5120) == pytest.approx(7.47, rel=0.02)


def test_an_unknown_sdpa_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--backends names only flash, cudnn, efficient or auto."""
    with pytest.raises(SystemExit):
        floor.main(["--backends", "flash,tensorcore", "--device", "cpu"])
    assert "unknown ['tensorcore']" in capsys.readouterr().err
