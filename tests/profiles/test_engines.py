"""Engines per GPU: the memory model's plan for N engines on one card, and each profile's word."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from app.cli import main
from app.profiles import PROFILES_DIR, ROOT
from app.profiles.engines import (
    ENGINE_MARGIN_BYTES,
    ENGINE_OVERHEAD_BYTES,
    MPS_ENGINES,
    MPS_SERVER_BYTES,
    plan_engines,
    plan_for_card,
)
from app.profiles.gpus import CARDS, Card, card_for_profile
from app.profiles.layout import layout_bytes
from app.profiles.memory import cuda_total, derive_for_card
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
def test_n_engines_fit_at_their_measured_footprint(
    card: Card, engines: int, shape: ModelShape
) -> None:
    """N engines, each its KV cache plus the overhead measured at load plus the margin, with the
    MPS server and the layout service fit in CUDA's total; each share is at most 1/N of the
    single-engine cap and no more than the engine's part, so vLLM's start check can pass; a card
    without room says so and fixes no KV cache."""
    result = plan_for_card(card, shape, engines)
    total = cuda_total(card.memory_bytes)
    if result.engine.kv_bytes <= 0:
        assert any(
            e.startswith(f"cannot start: {engines} engines leave no KV") for e in result.errors
        )
        assert result.limits.kv_cache_memory_bytes is None
        return
    share = result.limits.gpu_memory_utilization
    assert share is not None
    assert share <= math.floor(95 / engines) / 100
    each = result.footprint_bytes + ENGINE_MARGIN_BYTES
    assert share * total <= each
    assert engines * each + MPS_SERVER_BYTES + layout_bytes() <= total
    assert result.left_bytes == total - MPS_SERVER_BYTES - layout_bytes() - engines * (
        result.footprint_bytes
    )
    assert result.left_bytes >= engines * ENGINE_MARGIN_BYTES


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_each_engine_fits_the_device_plugins_per_client_cap(card: Card, shape: ModelShape) -> None:
    """The Kubernetes device plugin's MPS caps each client at 1/N of the card's memory: an
    engine at its measured footprint plus the margin stays below that cap."""
    result = plan_for_card(card, shape, MPS_ENGINES)
    if not result.errors:
        assert result.footprint_bytes + ENGINE_MARGIN_BYTES <= card.memory_bytes / MPS_ENGINES


TWO_FIT = ["v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"]
"""The cards with room for two engines at their measured footprint beside the layout service."""


def test_only_cards_of_32_gib_and_more_have_room_for_two_engines(shape: ModelShape) -> None:
    """The 12 GB RTX 3060, the T4, the 22.5 GiB A10 and L4 and the 24 GiB RTX 4090 cannot start
    two engines: 2 x 9.32 GiB (measured overhead and margin) plus the layout service's share at
    their batch (5.30 GiB at the 24 GB cards' 4) leave them no KV cache."""
    fits = [card.profile for card in CARDS if not plan_for_card(card, shape, 2).errors]
    assert fits == TWO_FIT


@pytest.mark.parametrize("profile", TWO_FIT)
def test_the_kv_cache_of_each_engine_is_fixed_to_its_plan(profile: str, shape: ModelShape) -> None:
    """kv-cache-memory-bytes is the engine's planned KV cache, a whole number of MiB, so engines
    can start together; max-num-seqs is what that cache holds (at most 256, a multiple of 8)."""
    card = card_for_profile(profile)
    assert card is not None
    result = plan_for_card(card, shape, MPS_ENGINES)
    fixed = result.limits.kv_cache_memory_bytes
    assert fixed is not None
    assert fixed == result.engine.kv_bytes
    assert fixed % 1024**2 == 0
    seqs = result.limits.max_num_seqs
    assert seqs == max(8, min(256, result.engine.concurrent_pages) // 8 * 8)


def test_the_engine_overhead_is_the_ninth_pass_measurement() -> None:
    """69.61 GiB held at load by the larger of two engines given 65,810,726,912 B of KV cache
    (layout-8300.cut.log in bench/results/gpu-h200-2026-12-02-pass9-raw/pass-raw.tar.gz): 8.32
    GiB beyond its KV cache, and the other engine's 7.13 GiB is inside it."""
    assert round(ENGINE_OVERHEAD_BYTES / GiB, 2) == 8.32
    assert 68.42 * GiB - 65_810_726_912 <= ENGINE_OVERHEAD_BYTES


def test_the_h200_default_leaves_the_layout_share_and_the_measured_overhead_free(
    shape: ModelShape,
) -> None:
    """The shipped default (two engines under MPS on an H200): with each engine's KV cache fixed,
    CUDA's 139.80 GiB less both KV caches leaves each engine its measured 8.32 GiB at load, the
    MPS server, the layout service's 8.25 GiB (it had 1.69 GiB in the ninth pass and failed) and
    a margin of at least 1 GiB per engine; re-counting it from the flags the engines get."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    flags = plan_for_card(card, shape, MPS_ENGINES).flags
    kv = int(flags["kv-cache-memory-bytes"])
    free = cuda_total(card.memory_bytes) - MPS_ENGINES * kv
    assert round(cuda_total(card.memory_bytes) / GiB, 2) == 139.80
    needed = MPS_ENGINES * ENGINE_OVERHEAD_BYTES + MPS_SERVER_BYTES + layout_bytes()
    assert free - needed >= MPS_ENGINES * ENGINE_MARGIN_BYTES
    assert kv < 65_810_726_912
    assert layout_bytes() >= 5.80 * GiB


def test_two_engines_on_an_h200_keep_their_batches_and_most_of_the_kv(shape: ModelShape) -> None:
    """H200, two engines: 0.47 each, 256 pages at once each, and together 88 % of the one
    engine's KV cache (2 x 54.62 of 123.55 GiB beside the layout service's 8.25: the price of the
    second is its measured overhead, the profile's CUDA graphs included, and margin)."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    one, two = plan_for_card(card, shape, 1), plan_for_card(card, shape, 2)
    assert two.flags["gpu-memory-utilization"] == 0.47
    assert two.flags["max-num-seqs"] == 256
    assert (two.errors, two.warnings) == ((), ())
    assert round(2 * two.engine.kv_bytes / one.engine.kv_bytes, 2) == 0.88


def test_a_small_card_has_no_room_for_two_engines(shape: ModelShape) -> None:
    """A 12 GB RTX 3060: beside the layout service at its card's batch of 1 (3.08 GiB, the
    preprocessing models counted) one engine holds 50 pages (48 at once) with the recipe's
    max-num-batched-tokens. Two cannot start at all (no KV cache), so no fixed KV cache is planned
    for them."""
    card = card_for_profile("rtx3060-12gb")
    assert card is not None
    one = plan_for_card(card, shape, 1)
    assert round(one.layout_bytes / GiB, 2) == 3.08
    assert (one.errors, one.engine.concurrent_pages, one.limits.max_num_seqs) == ((), 50, 48)
    assert one.limits.max_num_batched_tokens == 16384
    two = plan_for_card(card, shape, 2)
    assert any("negative KV memory" in e for e in two.errors)
    assert two.limits.kv_cache_memory_bytes is None


def test_too_many_engines_say_there_is_no_share(shape: ModelShape) -> None:
    """40 engines on 24 GiB: an error naming the engine count, not a zero utilization."""
    result = plan_engines(shape, 24 * GiB, 40)
    assert any("40 engines leave no KV cache" in e for e in result.errors)
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


def test_only_the_measured_h200_runs_two_engines_and_the_cpu_profile_one() -> None:
    """Measured on an H200 only (bench/results/gpu-h200-2026-12-01-hey-mps*), so only its class
    defaults to two: the H100's two read faster in one window each (bench/results/
    gpu-h100-2026-12-07-engines*), not in method 2's three, so it keeps one and says why; a class
    not measured keeps one, saying so; cpu.yaml says 1."""
    assert [card.profile for card in CARDS if card.engines_measured] == ["h200-141gb"]
    assert "# Engines: 1." in (ROOT / PROFILES_DIR / "cpu.yaml").read_text()
    assert [card.profile for card in CARDS if card.engines_per_gpu == 2] == ["h200-141gb"]
    h100 = engines_paragraph(card_for_profile("h100-80gb") or CARDS[0])
    assert "one window each" in h100
    assert "method 2's three" in h100


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
    assert "each engine at load      64.71 GiB  = KV cache 54.62 + measured overhead 10.09" in out
    assert "layout service            8.25 GiB" in out
    assert "left free at load         2.00 GiB  (2 x 1.00 GiB margin" in out
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
