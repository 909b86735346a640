"""Engines per GPU: the memory model's plan for N engines on one card, and each profile's word."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from app.cli import main
from app.profiles import PROFILES_DIR, ROOT
from app.profiles.engines import MPS_ENGINES, MPS_SERVER_BYTES, plan_engines, plan_for_card
from app.profiles.gpus import CARDS, Card, card_for_profile
from app.profiles.memory import (
    CONTEXT_BYTES,
    GEFORCE_RESERVE_BYTES,
    RESERVE_BYTES,
    derive_for_card,
)
from app.profiles.parsers import ServeParser
from app.profiles.shapes import GiB, ModelShape, load_shape

ENGINES_LINE = re.compile(r"^# Engines per GPU: (\d+), (measured|modelled)", re.MULTILINE)


@pytest.fixture(scope="module")
def shape() -> ModelShape:
    """PaddleOCR-VL 1.5, from the config.json shipped in the repo."""
    return load_shape()


def header(card: Card) -> str:
    """The comment lines a profile opens with (everything before its first flag)."""
    text = (ROOT / PROFILES_DIR / f"{card.profile}.yaml").read_text()
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))


def engines_paragraph(card: Card) -> str:
    """The header's `# Engines per GPU:` paragraph."""
    text = header(card)
    start = text.index("# Engines per GPU:")
    end = text.find("#\n", start)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_one_engine_is_the_profile_itself(card: Card, shape: ModelShape) -> None:
    """N = 1: the profile's own share and max-num-seqs, no fixed KV cache, nothing for MPS."""
    result = plan_for_card(card, shape, 1)
    derived = derive_for_card(card, shape)
    assert result.limits.gpu_memory_utilization == derived.gpu_memory_utilization
    assert result.limits.max_num_seqs == derived.max_num_seqs
    assert result.limits.kv_cache_memory_bytes is None
    assert result.mps_bytes == 0


@pytest.mark.parametrize("engines", [2, 3, 4])
@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_n_engines_leave_each_its_reserve_and_the_mps_server_outside(
    card: Card, engines: int, shape: ModelShape
) -> None:
    """N budgets + N reserves (context, allocations after the KV cache) + the MPS server fit in
    the card, and no engine gets more than its 1/N of the single-engine cap (0.95)."""
    result = plan_for_card(card, shape, engines)
    share = result.limits.gpu_memory_utilization
    assert share is not None
    assert share <= math.floor(95 / engines) / 100
    reserve = GEFORCE_RESERVE_BYTES if card.geforce else RESERVE_BYTES
    budget = math.ceil(share * card.memory_bytes)
    assert engines * (budget + reserve) + MPS_SERVER_BYTES <= card.memory_bytes
    assert result.left_bytes == card.memory_bytes - engines * budget


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_each_engine_fits_the_device_plugins_per_client_cap(card: Card, shape: ModelShape) -> None:
    """The Kubernetes device plugin's MPS caps each client at 1/N of the card's memory: an
    engine's budget plus its CUDA context stays below that cap."""
    result = plan_for_card(card, shape, MPS_ENGINES)
    assert result.engine.budget_bytes + CONTEXT_BYTES <= card.memory_bytes / MPS_ENGINES


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_the_kv_cache_of_each_engine_is_fixed_to_its_plan(card: Card, shape: ModelShape) -> None:
    """kv-cache-memory-bytes is the engine's planned KV cache, to the MiB below, so engines can
    start together; max-num-seqs is what that cache holds (at most 256, a multiple of 8)."""
    result = plan_for_card(card, shape, MPS_ENGINES)
    fixed = result.limits.kv_cache_memory_bytes
    assert fixed is not None
    assert 0 <= result.engine.kv_bytes - fixed < 1024**2
    seqs = result.limits.max_num_seqs
    assert seqs == max(8, min(256, result.engine.concurrent_pages) // 8 * 8)


def test_two_engines_on_an_h200_keep_their_batches_and_most_of_the_kv(shape: ModelShape) -> None:
    """H200, two engines: 0.47 each, 256 pages at once each, and together at least 95 % of the
    one engine's KV cache (the price of the second is its reserve and the MPS server)."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    one, two = plan_for_card(card, shape, 1), plan_for_card(card, shape, 2)
    assert two.flags["gpu-memory-utilization"] == 0.47
    assert two.flags["max-num-seqs"] == 256
    assert (two.errors, two.warnings) == ((), ())
    assert 2 * two.engine.kv_bytes >= 0.95 * one.engine.kv_bytes


def test_a_small_card_has_no_room_for_two_engines(shape: ModelShape) -> None:
    """A 12 GB RTX 3060: two engines would each hold 7 pages (one holds 144); three cannot
    start at all (negative KV memory)."""
    card = card_for_profile("rtx3060-12gb")
    assert card is not None
    assert plan_for_card(card, shape, 2).engine.concurrent_pages < 10
    assert any("negative KV memory" in e for e in plan_for_card(card, shape, 3).errors)


def test_too_many_engines_say_there_is_no_share(shape: ModelShape) -> None:
    """40 engines on 24 GiB: an error naming the engine count, not a zero utilization."""
    result = plan_engines(shape, 24 * GiB, 40)
    assert any("40 engines leave no share" in e for e in result.errors)
    with pytest.raises(ValueError, match="1 or more"):
        plan_engines(shape, 24 * GiB, 0)


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_each_profile_header_states_its_engines_per_gpu(card: Card, shape: ModelShape) -> None:
    """`# Engines per GPU: N, measured|modelled` as the catalogue has it; every two-engine class's
    plan starts without warnings at 256 pages at once; a figure the paragraph quotes for two
    engines (pages in one engine's KV cache) is the plan's."""
    found = ENGINES_LINE.findall(header(card))
    assert found == [
        (str(card.engines_per_gpu), "measured" if card.engines_measured else "modelled")
    ]
    two = plan_for_card(card, shape, 2)
    if card.engines_per_gpu == 2:
        assert (two.errors, two.warnings, two.flags["max-num-seqs"]) == ((), (), 256)
    paragraph = engines_paragraph(card)
    if "--engines-per-gpu 2" in paragraph.replace("#", "").replace("\n", " "):
        assert f"{two.engine.concurrent_pages:,}" in paragraph


def test_only_the_h200_is_measured_and_the_cpu_profile_has_one_engine() -> None:
    """Measured on an H200 only (bench/results/gpu-h200-2026-12-01-hey-mps*); cpu.yaml says 1."""
    assert [card.profile for card in CARDS if card.engines_measured] == ["h200-141gb"]
    assert "# Engines: 1." in (ROOT / PROFILES_DIR / "cpu.yaml").read_text()
    assert sorted(card.profile for card in CARDS if card.engines_per_gpu == 2) == [
        "h100-80gb",
        "h200-141gb",
    ]


def test_the_plan_flags_are_vllm_flags_and_win_over_the_profile(
    serve_parser: ServeParser, shape: ModelShape
) -> None:
    """`vllm serve MODEL --config h200-141gb.yaml` plus the two-engine flags, through vLLM's own
    parser: each flag is vLLM's, and the command line's value is the one vLLM keeps."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    flags = plan_for_card(card, shape, 2).flags
    extra = [part for key, value in flags.items() for part in (f"--{key}", str(value))]
    namespace = serve_parser.parse_config_file(ROOT / PROFILES_DIR / "h200-141gb.yaml", *extra)
    assert namespace.gpu_memory_utilization == flags["gpu-memory-utilization"]
    assert namespace.max_num_seqs == flags["max-num-seqs"]
    assert namespace.kv_cache_memory_bytes == flags["kv-cache-memory-bytes"]
    assert namespace.max_model_len == 8192


def test_plan_command_plans_two_engines(capsys: pytest.CaptureFixture[str]) -> None:
    """`ocrvl profile plan --profile h200-141gb --engines-per-gpu 2`: the split, what is left
    for MPS and the contexts, and one engine's breakdown; --yaml prints each engine's flags."""
    assert main(["profile", "plan", "--profile", "h200-141gb", "--engines-per-gpu", "2"]) == 0
    out = capsys.readouterr().out
    assert "engines per GPU         2 (under MPS): each gpu-memory-utilization 0.47" in out
    assert "MPS server 0.50 GiB" in out
    assert "max-num-seqs            256  -> 256 pages at once" in out
    assert "kv-cache-memory-bytes   " in out
    command = ["profile", "plan", "--profile", "h200-141gb", "--engines-per-gpu", "2", "--yaml"]
    assert main(command) == 0
    card = card_for_profile("h200-141gb")
    assert card is not None
    assert yaml.safe_load(capsys.readouterr().out) == plan_for_card(card, load_shape(), 2).flags


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engines-per-gpu", "0"], "--engines-per-gpu must be 1 or more"),
        (["--engines-per-gpu", "2", "--utilization", "0.5"], "leave out --utilization"),
        (["--env"], "2 or more with --env"),
    ],
)
def test_plan_command_refuses_what_it_cannot_plan(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and the reason: no engines, a share given by hand, an env file for one engine."""
    assert main(["profile", "plan", "--profile", "h200-141gb", *extra]) == 2
    assert message in capsys.readouterr().err


def test_plan_command_fails_engines_that_cannot_start(capsys: pytest.CaptureFixture[str]) -> None:
    """Three engines on a T4: exit 1, the negative KV memory named."""
    assert main(["profile", "plan", "--profile", "t4-16gb", "--engines-per-gpu", "3"]) == 1
    assert "negative KV memory" in capsys.readouterr().out
