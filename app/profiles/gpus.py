"""The GPU catalogue: one card class per profile, as `nvidia-smi` reports it."""

from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 1024**2


@dataclass(frozen=True)
class Card:
    """A GPU class a profile is sized for; `memory_mib` is nvidia-smi's `memory.total`.

    `engines_per_gpu` is how many engines the class runs by default (`make serve`, compose, the
    Kubernetes pools): two under MPS only where that was measured faster on such a card, one
    elsewhere; `engines_measured` says whether the number was measured or is modelled, and
    `grounds` why, in a phrase. The profile's header says the same (app/profiles/headers.py,
    tests/profiles/test_engines.py); docs/engines-per-gpu.md gives the figures behind it.
    """

    profile: str
    name: str
    pattern: str
    memory_mib: int
    compute_capability: float
    geforce: bool = False
    engines_per_gpu: int = 1
    engines_measured: bool = False
    grounds: str = ""

    @property
    def memory_bytes(self) -> int:
        """The card's total memory in bytes."""
        return self.memory_mib * MiB

    @property
    def has_bf16(self) -> bool:
        """bfloat16 needs compute capability 8.0 (Ampere)."""
        return self.compute_capability >= 8.0

    @property
    def has_flash_attention(self) -> bool:
        """FlashAttention (and so vLLM's default backends) needs compute capability 8.0."""
        return self.compute_capability >= 8.0

    def matches(self, name: str) -> bool:
        """Whether an nvidia-smi name (`Tesla V100-SXM2-32GB`) belongs to this class."""
        return re.search(self.pattern, name, re.IGNORECASE) is not None


GPU_BOUND = "GPU-bound, its floor below one engine's step loop"

CARDS: tuple[Card, ...] = (
    Card(
        "v100-32gb", "Tesla V100 32GB", r"V100S?\b", 32768, 7.0,
        grounds=f"{GPU_BOUND} (125 TFLOP/s, no FlashAttention: under 6 pages/s)",
    ),
    Card(
        "t4-16gb", "Tesla T4", r"\bT4\b", 15360, 7.5,
        grounds=f"{GPU_BOUND} (65 TFLOP/s: ~3 pages/s)",
    ),
    Card(
        "rtx3060-12gb", "GeForce RTX 3060 12GB", r"RTX 3060\b", 12288, 8.6, geforce=True,
        grounds=f"{GPU_BOUND} (~25 TFLOP/s: ~1 page/s)",
    ),
    Card(
        "rtx4090-24gb", "GeForce RTX 4090", r"RTX 4090\b", 24564, 8.9, geforce=True,
        grounds=f"{GPU_BOUND} (165 TFLOP/s: ~7 pages/s)",
    ),
    Card(
        "a10-24gb", "NVIDIA A10 / A10G", r"\bA10G?\b", 23028, 8.6,
        grounds=f"{GPU_BOUND} (125 TFLOP/s: ~5 pages/s)",
    ),
    Card(
        "l4-24gb", "NVIDIA L4", r"\bL4\b", 23034, 8.9,
        grounds=f"{GPU_BOUND} (121 TFLOP/s: ~5 pages/s)",
    ),
    Card(
        "a100-40gb", "NVIDIA A100 40GB", r"\bA100\b", 40960, 8.0,
        grounds=f"{GPU_BOUND} (312 TFLOP/s: ~14 pages/s)",
    ),
    Card(
        "a100-80gb", "NVIDIA A100 80GB", r"\bA100\b", 81920, 8.0,
        grounds=f"{GPU_BOUND} (312 TFLOP/s: ~14 pages/s)",
    ),
    Card(
        "h100-80gb", "NVIDIA H100 80GB", r"\bH100\b", 81559, 9.0,
        grounds="two read 1.38x one in one window each; one until method 2's three windows a"
        " variant confirm it (docs/engines-per-gpu.md)",
    ),
    Card(
        "h200-141gb", "NVIDIA H200", r"\bH200\b", 143771, 9.0,
        engines_per_gpu=2, engines_measured=True,
        grounds="two under NVIDIA MPS measured 1.55x and 1.56x one engine",
    ),
)  # fmt: skip

CPU_PROFILE = "cpu"


def card_for_profile(profile: str) -> Card | None:
    """The card a profile name is sized for; None for `cpu` or an unknown name."""
    return next((card for card in CARDS if card.profile == profile), None)
