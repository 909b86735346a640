"""Several engines on one GPU under NVIDIA MPS: each engine's share, its KV cache, what is left.

Every engine is a whole vLLM (its own weights, activation peak, CUDA graphs and KV cache); MPS
lets their kernels run side by side on the GPU's SMs through one MPS server. The plan gives
each of N engines the same share and keeps outside all of their budgets one reserve per engine
(its CUDA context and allocations after the KV cache, as for one engine) and the MPS server:

    share = min(0.95 / N, (total - N x reserve - MPS server) / N / total), floored to 0.01
    engine = `memory.plan` at that share, max-num-seqs refitted to the pages its KV cache holds
    left  = total - N x ceil(share x total)   (contexts, MPS server, allocations after the KV)

The KV cache of each engine is also fixed (`kv-cache-memory-bytes`) to what the plan gives it,
so the engines can start together (each vLLM otherwise sizes its cache from the memory it finds
free, which another engine's start changes), and an engine under the Kubernetes device plugin's
MPS, which caps each client at 1/N of the card, gets the same cache whichever total CUDA reports.
N = 1 is the profile itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.profiles.gpus import Card
from app.profiles.memory import (
    GEFORCE_RESERVE_BYTES,
    RECIPE_MAX_NUM_BATCHED_TOKENS,
    RESERVE_BYTES,
    UTILIZATION_CAP,
    EngineLimits,
    MemoryPlan,
    MiB,
    derive,
    plan,
    utilization_for,
)
from app.profiles.shapes import GiB, ModelShape

MPS_SERVER_BYTES = GiB // 2
"""nvidia-cuda-mps-server's own context on the GPU (modelled, as one engine's CUDA context)."""
MPS_ENGINES = 2
"""The layout compose and Kubernetes ship: two engines per GPU (measured on an H200)."""


@dataclass(frozen=True)
class EnginesPlan:
    """N engines on one GPU: one engine's limits and plan (all are alike) and the remainder."""

    engines: int
    total_bytes: int
    limits: EngineLimits
    engine: MemoryPlan
    reserve_bytes: int
    mps_bytes: int
    left_bytes: int
    errors: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def flags(self) -> dict[str, float | int]:
        """What each engine passes after `--config <profile>` (the command line wins)."""
        flags: dict[str, float | int] = {
            "gpu-memory-utilization": self.limits.gpu_memory_utilization or 0.0,
            "max-num-seqs": self.limits.max_num_seqs,
        }
        if self.limits.kv_cache_memory_bytes is not None:
            flags["kv-cache-memory-bytes"] = self.limits.kv_cache_memory_bytes
        return flags


def share_for(total_bytes: int, engines: int, geforce: bool = False) -> float:
    """Each engine's gpu-memory-utilization: the card less the reserves, split evenly."""
    if engines == 1:
        return utilization_for(total_bytes, geforce)
    reserve = GEFORCE_RESERVE_BYTES if geforce else RESERVE_BYTES
    free = total_bytes - engines * reserve - MPS_SERVER_BYTES
    share = math.floor(free / engines / total_bytes * 100) / 100
    return max(0.0, min(math.floor(UTILIZATION_CAP / engines * 100) / 100, share))


def plan_engines(
    shape: ModelShape,
    total_bytes: int,
    engines: int,
    *,
    geforce: bool = False,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    dtype_bytes: int = 2,
) -> EnginesPlan:
    """Plan `engines` engines on one card of `total_bytes` (1: the profile's own numbers)."""
    if engines < 1:
        raise ValueError(f"engines per GPU must be 1 or more; got {engines}")
    share = share_for(total_bytes, engines, geforce)
    limits = derive(
        total_bytes,
        shape,
        geforce=geforce,
        utilization=share or 0.01,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens or RECIPE_MAX_NUM_BATCHED_TOKENS,
    )
    limits = replace(limits, dtype_bytes=dtype_bytes)
    engine = plan(shape, limits, total_bytes)
    errors = list(engine.errors)
    if share <= 0:
        errors.insert(0, f"cannot start: {engines} engines leave no share of the card")
    if engines > 1 and engine.kv_bytes > 0:
        limits = replace(limits, kv_cache_memory_bytes=engine.kv_bytes // MiB * MiB)
    reserve = GEFORCE_RESERVE_BYTES if geforce else RESERVE_BYTES
    mps = MPS_SERVER_BYTES if engines > 1 else 0
    left = total_bytes - engines * engine.budget_bytes
    return EnginesPlan(
        engines=engines,
        total_bytes=total_bytes,
        limits=limits,
        engine=engine,
        reserve_bytes=engines * reserve,
        mps_bytes=mps,
        left_bytes=left,
        errors=tuple(errors),
        warnings=engine.warnings,
    )


def plan_for_card(card: Card, shape: ModelShape, engines: int) -> EnginesPlan:
    """`plan_engines` for a catalogue card."""
    return plan_engines(shape, card.memory_bytes, engines, geforce=card.geforce)
