"""The memory model: vLLM's KV arithmetic, the warnings, and the numbers in every profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.profiles import PROFILES_DIR, ROOT
from app.profiles.engines import plan_engines, plan_for_card
from app.profiles.gpus import CARDS, Card, card_for_profile
from app.profiles.layout import layout_bytes
from app.profiles.memory import (
    MORE_GRAPHS_BYTES,
    EngineLimits,
    MiB,
    cuda_total,
    derive_for_card,
    kv_cache_tokens,
    plan,
)
from app.profiles.shapes import GiB, ModelShape, load_shape

PLANNED = ("gpu-memory-utilization", "max-model-len", "max-num-seqs", "max-num-batched-tokens")


@pytest.fixture(scope="module")
def shape() -> ModelShape:
    """PaddleOCR-VL 1.5, from the config.json shipped in the repo."""
    return load_shape()


def test_kv_bytes_per_token_come_from_the_config(shape: ModelShape) -> None:
    """18 layers x 2 KV heads x head_dim 128 x K,V x 2 bytes = 18 KiB (MEASURED.md)."""
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (18, 2, 128)
    assert shape.kv_bytes_per_token(2) == 18_432
    assert shape.max_visual_tokens_per_image == 1280


def test_another_config_changes_the_dimensions(tmp_path: Path) -> None:
    """A flat config with its own dimensions (and no head_dim) is read, not the defaults."""
    config = {
        "num_hidden_layers": 4,
        "num_key_value_heads": 1,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "intermediate_size": 1024,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    other = load_shape(tmp_path / "config.json")
    assert other.kv_bytes_per_token(4) == 4 * 1 * 64 * 2 * 4


@pytest.mark.parametrize(
    ("kv_bytes", "per_token", "block", "max_len", "expected"),
    [
        (268_435_456, 2048, 128, 4096, (1024, 131_072)),  # cpu.yaml with the tiny model
        (268_435_456, 2048, 128, 4000, (1024, 128_000)),  # max-model-len not a block multiple
        (100 * 18_432 * 16 - 1, 18_432, 16, 8192, (99, 1584)),  # a partial block is dropped
        (-5, 18_432, 16, 8192, (0, 0)),
    ],
)
def test_kv_tokens_follow_vllms_arithmetic(
    kv_bytes: int, per_token: int, block: int, max_len: int, expected: tuple[int, int]
) -> None:
    """blocks = bytes // (block x bytes/token); tokens = blocks / blocks-per-request x max len."""
    assert kv_cache_tokens(kv_bytes, per_token, block, max_len) == expected


def test_low_utilization_cannot_start(shape: ModelShape) -> None:
    """vllm#31372: a budget below weights + activations means negative KV memory."""
    limits = EngineLimits(8192, 64, 16384, gpu_memory_utilization=0.15)
    result = plan(shape, limits, 24 * GiB)
    assert result.kv_bytes < 0
    assert any("negative KV memory" in error for error in result.errors)


def test_utilization_above_free_memory_cannot_start(shape: ModelShape) -> None:
    """The CUDA context is up before vLLM asks for its budget."""
    result = plan(shape, EngineLimits(8192, 64, 16384, gpu_memory_utilization=0.99), 12 * GiB)
    assert any("free once the CUDA context is up" in error for error in result.errors)


def test_more_sequences_than_pages_warns_of_queueing(shape: ModelShape) -> None:
    """max-num-seqs beyond what the KV cache holds is a warning, not an error."""
    result = plan(shape, EngineLimits(8192, 512, 16384, gpu_memory_utilization=0.6), 24 * GiB)
    assert not result.errors
    assert result.concurrent_pages < 512
    assert any(warning.startswith("will queue") for warning in result.warnings)


def test_a_budget_that_leaves_no_room_for_the_layout_service_fails(shape: ModelShape) -> None:
    """The layout service shares the GPU: 0.8 of 12 GiB (11.40 GiB as CUDA counts it) leaves
    1.78 GiB beside vLLM's context, less than the 3.08 GiB its context, models, batch of 1 (the
    batch a 12 GiB card gets) and allocator's cache take; on 24 GiB, 0.8 leaves 4.18 GiB, less
    than its 5.30 GiB at batch 4 (app/profiles/layout.py)."""
    result = plan(shape, EngineLimits(8192, 64, 16384, gpu_memory_utilization=0.8), 12 * GiB)
    assert (result.layout_batch, result.layout_bytes) == (1, layout_bytes(1))
    assert [e for e in result.errors if e.startswith("no room for the layout service")] == [
        "no room for the layout service: gpu-memory-utilization 0.8 leaves 1.78 GiB beside "
        "vLLM's CUDA context, and the layout service on the same GPU needs 3.08 GiB at "
        "--max-batch 1 (app/profiles/layout.py); lower it"
    ]
    result = plan(shape, EngineLimits(8192, 64, 16384, gpu_memory_utilization=0.8), 24 * GiB)
    assert (result.layout_batch, result.layout_bytes) == (4, layout_bytes(4))
    assert any(
        "leaves 4.18 GiB" in e and "needs 5.30 GiB at --max-batch 4" in e for e in result.errors
    )


def test_the_budget_is_a_share_of_the_total_cuda_reports(shape: ModelShape) -> None:
    """vLLM multiplies the utilization by CUDA's total, 615 MiB below nvidia-smi's on the H200
    (143,771 MiB against 139.80 GiB in the ninth pass's OOM report)."""
    assert cuda_total(143_771 * 1024**2) == 150_109_880_320
    limits = EngineLimits(8192, 256, 16384, gpu_memory_utilization=0.5)
    assert plan(shape, limits, 143_771 * 1024**2).budget_bytes == 75_054_940_160


def test_short_max_model_len_warns_about_paddleocrs_request(shape: ModelShape) -> None:
    """PaddleOCR's client asks for 4,096 completion tokens on every page."""
    result = plan(shape, EngineLimits(2048, 8, 2048, gpu_memory_utilization=0.9), 24 * GiB)
    assert any("400" in warning for warning in result.warnings)


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_each_profile_holds_the_memory_models_numbers(card: Card, shape: ModelShape) -> None:
    """Every number in vllm_configs/<profile>.yaml is what the model derives for that card."""
    flags = yaml.safe_load((ROOT / PROFILES_DIR / f"{card.profile}.yaml").read_text())
    derived = derive_for_card(card, shape)
    expected = {
        "gpu-memory-utilization": derived.gpu_memory_utilization,
        "max-model-len": derived.max_model_len,
        "max-num-seqs": derived.max_num_seqs,
        "max-num-batched-tokens": derived.max_num_batched_tokens,
    }
    assert {key: flags[key] for key in PLANNED} == expected
    result = plan(shape, EngineLimits.from_flags(flags), card.memory_bytes)
    assert (result.errors, result.warnings) == ((), ())


ENCODER_GRAPHS = '{"cudagraph_mm_encoder": true}'
SIZES_TO_2048 = json.dumps({"cudagraph_capture_sizes": [1, 2, 4, 512, 1024, 2048]})
SIZES_TO_512 = json.dumps({"cudagraph_capture_sizes": [1, 2, 4, 256, 512]})


@pytest.mark.parametrize(
    ("config", "more"),
    [(ENCODER_GRAPHS, True), (SIZES_TO_2048, True), (SIZES_TO_512, False), (None, False)],
    ids=["encoder-graphs", "sizes-to-2048", "sizes-to-512", "none"],
)
def test_more_cuda_graphs_than_vllms_default_come_out_of_the_kv_cache(
    shape: ModelShape, config: str | None, more: bool
) -> None:
    """A profile that records the encoder's graphs or sizes past 512 counts their measured
    memory; vLLM's own set (sizes to 512) costs what it did."""
    flags = yaml.safe_load((ROOT / PROFILES_DIR / "a100-80gb.yaml").read_text())
    card = card_for_profile("a100-80gb")
    assert card is not None
    assert "compilation-config" not in flags
    plain = plan(shape, EngineLimits.from_flags(flags), card.memory_bytes)
    given = {**flags, "compilation-config": config} if config else flags
    graphed = plan(shape, EngineLimits.from_flags(given), card.memory_bytes)
    extra = MORE_GRAPHS_BYTES if more else 0
    assert graphed.graph_bytes == plain.graph_bytes + extra
    assert graphed.kv_bytes == plain.kv_bytes - extra
    assert graphed.budget_bytes == plain.budget_bytes


def test_a_compilation_config_that_is_no_json_is_refused(shape: ModelShape) -> None:
    """The model cannot guess what a malformed config records: it says so (the check reports
    the key through vLLM's parser)."""
    flags = yaml.safe_load((ROOT / PROFILES_DIR / "a100-80gb.yaml").read_text())
    with pytest.raises(ValueError, match="Expecting property name"):
        EngineLimits.from_flags({**flags, "compilation-config": "{cudagraph_mm_encoder: yes"})


def test_engines_beside_each_other_give_the_more_graphs_up_from_their_fixed_kv_cache(
    shape: ModelShape,
) -> None:
    """Two engines have a fixed KV cache, so the graphs would come on top of the measured
    overhead: each KV cache is smaller by their memory instead, and the H100's profile, which
    records them, is planned so."""
    card = card_for_profile("h100-80gb")
    assert card is not None
    plain = plan_engines(shape, card.memory_bytes, 2)
    graphed = plan_engines(shape, card.memory_bytes, 2, more_graphs=True)
    plain_kv, graphed_kv = plain.limits.kv_cache_memory_bytes, graphed.limits.kv_cache_memory_bytes
    assert plain_kv is not None
    assert graphed_kv is not None
    assert plain_kv - graphed_kv == pytest.approx(MORE_GRAPHS_BYTES, abs=MiB)
    assert graphed.overhead_bytes == plain.overhead_bytes + MORE_GRAPHS_BYTES
    assert plan_for_card(card, shape, 2).limits.kv_cache_memory_bytes == graphed_kv


def test_plan_command_reports_the_kv_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """`ocrvl profile plan --gpu-mem-gib 24` prints the budget split and the pages that fit."""
    assert main(["profile", "plan", "--gpu-mem-gib", "24", "--max-num-seqs", "64"]) == 0
    out = capsys.readouterr().out
    assert "18,432 B = 18 layers x 2 KV heads x 128" in out
    assert "max-num-seqs            64  -> 64 pages at once" in out


def test_plan_command_fails_a_config_that_cannot_start(capsys: pytest.CaptureFixture[str]) -> None:
    """Exit status 1 and the reason when the KV memory would be negative."""
    assert main(["profile", "plan", "--gpu-mem-gib", "24", "--utilization", "0.15"]) == 1
    assert "negative KV memory" in capsys.readouterr().out


@pytest.mark.parametrize("profile", ["h100-80gb", "h200-141gb", "a100-80gb"])
def test_a_profiles_memory_comments_are_what_the_plan_command_prints(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lines from "The largest share" to max-num-batched-tokens are `plan --yaml`'s, their
    KV cache less the CUDA graphs the profile records (the H100's and H200's; the A100's none)."""
    assert main(["profile", "plan", "--profile", profile, "--yaml"]) == 0
    printed = capsys.readouterr().out
    text = (ROOT / PROFILES_DIR / f"{profile}.yaml").read_text()
    start = text.index("# The largest share")
    end = text.index("\n", text.index("max-num-batched-tokens:")) + 1
    assert text[start:end] == printed
    graphs = "CUDA graphs 2.04 GiB" if profile != "a100-80gb" else "CUDA graphs 0.27 GiB"
    assert graphs in printed


def test_plan_command_prints_the_yaml_block(capsys: pytest.CaptureFixture[str]) -> None:
    """--yaml prints the lines a profile carries, with the same numbers."""
    assert main(["profile", "plan", "--profile", "rtx3060-12gb", "--yaml"]) == 0
    flags = yaml.safe_load(capsys.readouterr().out)
    profile = yaml.safe_load((ROOT / PROFILES_DIR / "rtx3060-12gb.yaml").read_text())
    assert {key: profile[key] for key in PLANNED} == flags
