"""The memory model against what vLLM 0.23 logged on a real H200 (bench/results/gpu-h200-*)."""

from __future__ import annotations

import json

import pytest
import yaml

from app.profiles import PROFILES_DIR, ROOT
from app.profiles.gpus import card_for_profile
from app.profiles.memory import EngineLimits, plan
from app.profiles.shapes import load_shape

MEASURED = ROOT / "bench" / "results" / "gpu-h200-2026-11-30.json"


def _logged(layout: str) -> dict[str, float]:
    report = json.loads(MEASURED.read_text())
    found = next(row for row in report["layouts"] if row["layout"] == layout)
    logged: dict[str, float] = found["engines_logged"][0]
    return logged


def test_the_h200_profile_predicts_the_kv_cache_vllm_logged() -> None:
    """h200-141gb.yaml as shipped: the model's KV tokens within 2 % of the H200's, on the safe
    side (fewer, never more, than vLLM allocates)."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    flags = yaml.safe_load((ROOT / PROFILES_DIR / "h200-141gb.yaml").read_text())
    result = plan(load_shape(), EngineLimits.from_flags(flags), card.memory_bytes)
    measured = _logged("default")["kv_cache_tokens"]
    assert measured == 7_570_528
    assert result.kv_tokens == pytest.approx(measured, rel=0.02)
    assert result.kv_tokens <= measured


def test_the_model_over_reserves_weights_and_cuda_graphs() -> None:
    """What vLLM logged is below the model's terms (1.89 and 0.5 GiB): room the model keeps."""
    logged = _logged("default")
    assert logged["weights_gib"] == pytest.approx(1.82)
    assert logged["cuda_graphs_gib"] == pytest.approx(0.27)
    assert load_shape().weights_bytes / 2**30 == pytest.approx(1.89)
