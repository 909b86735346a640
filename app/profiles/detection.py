"""`ocrvl profile detect`: which profile fits each GPU that nvidia-smi reports."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from app.profiles.gpus import CARDS, CPU_PROFILE, Card

QUERY = "name,memory.total,compute_cap"
QUERY_OLD_DRIVER = "name,memory.total"
"""Drivers before R510 do not know `compute_cap` and refuse the whole query."""
MEMORY_SLACK = 0.98
"""A card counts as one of a class when it has at least 98 % of the class's memory."""


class DetectionError(ValueError):
    """A GPU no profile fits, or nvidia-smi output that cannot be read."""


@dataclass(frozen=True)
class Gpu:
    """One line of `nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv`."""

    name: str
    memory_mib: int
    compute_capability: float | None


@dataclass(frozen=True)
class Match:
    """The profile for one GPU; `note` says when it is a stand-in rather than its own class."""

    gpu: Gpu
    profile: str
    note: str | None = None


def parse_csv(text: str) -> list[Gpu]:
    """Parse nvidia-smi's CSV (header line, then `Tesla V100-SXM2-32GB, 32768 MiB, 7.0`)."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) not in (2, 3) or fields[0] == "name":
            continue
        name, memory, capability = (*fields, "[N/A]")[:3]
        try:
            memory_mib = int(memory.split()[0])
        except (ValueError, IndexError) as exc:
            raise DetectionError(
                f"nvidia-smi: cannot read memory.total {memory!r} of {name}"
            ) from exc
        try:
            cc: float | None = float(capability)
        except ValueError:
            cc = None  # `[N/A]` on old drivers
        gpus.append(Gpu(name, memory_mib, cc))
    return gpus


def query() -> list[Gpu]:
    """The GPUs nvidia-smi reports; none when it is missing, fails or finds no device."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return []
    for fields in (QUERY, QUERY_OLD_DRIVER):
        try:
            result = subprocess.run(  # noqa: S603 - fixed arguments
                [executable, f"--query-gpu={fields}", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        if result.returncode == 0:
            return parse_csv(result.stdout)
    return []


def _fits(card: Card, gpu: Gpu) -> bool:
    return gpu.memory_mib >= card.memory_mib * MEMORY_SLACK


def _same_kernels(card: Card, cc: float) -> bool:
    """sm_70 needs the V100 image; sm_75 has no FlashAttention; 8.0+ share every profile's flags."""
    if cc < 7.5:
        return card.compute_capability < 7.5
    if cc < 8.0:
        return 7.5 <= card.compute_capability < 8.0
    return card.compute_capability >= 8.0


def match(gpu: Gpu) -> Match:
    """The profile of the GPU's own class, else the largest profile of its kind that fits."""
    named = [card for card in CARDS if card.matches(gpu.name) and _fits(card, gpu)]
    if named:
        return Match(gpu, max(named, key=lambda card: card.memory_mib).profile)
    cc = gpu.compute_capability
    if cc is None:
        raise DetectionError(f"{gpu.name}: unknown card and nvidia-smi gives no compute capability")
    similar = [card for card in CARDS if _same_kernels(card, cc) and _fits(card, gpu)]
    if not similar:
        raise DetectionError(
            f"no profile fits {gpu.name} ({gpu.memory_mib} MiB, compute capability {cc}); "
            f"size one with `ocrvl profile plan --gpu-mem-gib {gpu.memory_mib / 1024:.1f}`"
        )
    card = max(similar, key=lambda card: card.memory_mib)
    note = f"{gpu.name} has no profile of its own; {card.profile} is sized for {card.name}"
    return Match(gpu, card.profile, note)


def detect() -> list[Match]:
    """One match per GPU, or the CPU profile when there is no GPU."""
    gpus = query()
    if not gpus:
        return [Match(Gpu("no GPU", 0, None), CPU_PROFILE)]
    return [match(gpu) for gpu in gpus]
