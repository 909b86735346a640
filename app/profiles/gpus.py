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
    elsewhere; `engines_measured` says whether the number was measured or is modelled. The
    profile's header says the same and gives the grounds (tests/profiles/test_engines.py).
    """

    profile: str
    name: str
    pattern: str
    memory_mib: int
    compute_capability: float
    geforce: bool = False
    engines_per_gpu: int = 1
    engines_measured: bool = False

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


CARDS: tuple[Card, ...] = (
    Card("v100-32gb", "Tesla V100 32GB", r"V100S?\b", 32768, 7.0),
    Card("t4-16gb", "Tesla T4", r"\bT4\b", 15360, 7.5),
    Card("rtx3060-12gb", "GeForce RTX 3060 12GB", r"RTX 3060\b", 12288, 8.6, geforce=True),
    Card("rtx4090-24gb", "GeForce RTX 4090", r"RTX 4090\b", 24564, 8.9, geforce=True),
    Card("a10-24gb", "NVIDIA A10 / A10G", r"\bA10G?\b", 23028, 8.6),
    Card("l4-24gb", "NVIDIA L4", r"\bL4\b", 23034, 8.9),
    Card("a100-40gb", "NVIDIA A100 40GB", r"\bA100\b", 40960, 8.0),
    Card("a100-80gb", "NVIDIA A100 80GB", r"\bA100\b", 81920, 8.0),
    Card("h100-80gb", "NVIDIA H100 80GB", r"\bH100\b", 81559, 9.0),
    Card(
        "h200-141gb",
        "NVIDIA H200",
        r"\bH200\b",
        143771,
        9.0,
        engines_per_gpu=2,
        engines_measured=True,
    ),
)

CPU_PROFILE = "cpu"


def card_for_profile(profile: str) -> Card | None:
    """The card a profile name is sized for; None for `cpu` or an unknown name."""
    return next((card for card in CARDS if card.profile == profile), None)
