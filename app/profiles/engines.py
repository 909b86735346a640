"""Several engines on one GPU under NVIDIA MPS: each engine's KV cache, share and what is left.

Every engine is a whole vLLM (its own weights, activations, CUDA graphs and KV cache); MPS lets
their kernels run side by side on the GPU's SMs through one MPS server. Each engine's KV cache
is fixed (`kv-cache-memory-bytes`), so the engines can start together (each vLLM otherwise sizes
its cache from the memory it finds free, which another engine's start changes) and an engine
under the Kubernetes device plugin's MPS, which caps each client at 1/N of the card, gets the
same cache whichever total CUDA reports. With a fixed KV cache vLLM skips its memory profiling,
so nothing in vLLM keeps the rest of the engine inside a budget: the plan counts it as measured.

    usable  = CUDA's total - MPS server - the layout service's share (`layout.py`)
    KV      = usable / N - the measured overhead of one engine - the margin, down to the MiB
    share   = (KV + overhead + margin) / CUDA's total, down to 0.01 (vLLM checks at start that
              this much is free; it does not size anything from it)
    left    = usable - N x (KV + overhead): the margins, free on the GPU at load

The overhead is what one engine held beyond its KV cache at load on the H200 of the ninth pass
(`ENGINE_OVERHEAD_BYTES`, below); the share of other cards is that figure too (modelled: only the
H200 was measured). N = 1 is the profile itself (`memory.derive`), where vLLM's own profiling
sizes the KV cache inside its budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import yaml

from app.profiles import PROFILES_DIR, ROOT
from app.profiles.gpus import Card
from app.profiles.memory import (
    CUDA_GRAPH_BYTES,
    MAX_NUM_SEQS_CAP,
    UTILIZATION_CAP,
    EngineLimits,
    MemoryPlan,
    MiB,
    cuda_total,
    derive,
    graph_bytes,
    layout_share,
    more_graphs,
    plan,
)
from app.profiles.shapes import GiB, ModelShape

MEASURED_KV_BYTES = 65_810_726_912
"""The KV cache each of the ninth pass's two engines was given (`--kv-cache-memory-bytes`;
"reserved 61.29 GiB memory for KV Cache" in vllm-8118.log and vllm-8119.log)."""
MEASURED_ENGINE_BYTES = round(69.61 * GiB)
"""The larger of the two engines at load (c=512, window 5 then 6): "Process 6238 has 69.61 GiB
memory in use" (the other 68.42 GiB), in the layout service's OOM report, layout-8300.cut.log."""
ENGINE_OVERHEAD_BYTES = MEASURED_ENGINE_BYTES - MEASURED_KV_BYTES
"""One engine beyond its KV cache under MPS at load: 8.32 GiB (the other engine 7.13). Its parts,
from bench/results/gpu-h200-2026-12-02-pass9-raw/pass-raw.tar.gz (vLLM 0.32.0, torch 2.13, the
plugin on, max-num-seqs 256, max-num-batched-tokens 16,384):

    weights                       1.82 GiB  "Model loading took 1.82 GiB" (every engine's log)
    CUDA graphs                   0.27 GiB  "Graph capturing finished ..., took 0.27 GiB" with the
                                            engine starting alone (serve-stock, serve-plugin);
                                            the default's two starting together logged -2.15 and
                                            0.47 GiB, each counting the other's allocations
    the rest after start          0.9-1.3 GiB  CUDA context under MPS, what the start's warm-up
                                            left in torch's caching allocator, non-torch memory;
                                            from 05-default-c512.gpu.csv: 133,379 MiB in use
                                            with both engines idle beside the layout service
                                            (0.9-1.62 GiB) and the MPS server (66 MiB)
    growth under load             4.4-4.7 GiB  activations of 256 pages at a time kept by
                                            torch's caching allocator, and its slack: 142,637 MiB
                                            in use at the end of window 5, 68.42 + 69.61 GiB at the
                                            OOM report

vLLM logged no activation peak or non-torch figure: with kv-cache-memory-bytes it "skipped memory
profiling". Without MPS the same engine grew less under the same load (two engines of 16 GiB KV:
3.3 GiB each idle, +0.8 and +1.4 GiB in windows 1 and 2, 01-stock-c256.gpu.csv and
02-plugin-c256.gpu.csv); the plan takes the MPS figure, the layout it is for."""
ENGINE_MARGIN_BYTES = 1 * GiB
"""Kept free per engine beyond the measured overhead: the two alike engines differed by 1.19 GiB,
and a longer run or other pages may grow the allocator's cache further."""
MPS_SERVER_BYTES = 128 * MiB
"""nvidia-cuda-mps-server on the GPU: 66 MiB measured (process 5228 in the same OOM report, the
only other CUDA process), doubled."""
MPS_ENGINES = 2
"""Two engines per GPU under MPS: what a class whose header says 2 runs (measured on an H200)."""


@dataclass(frozen=True)
class EnginesPlan:
    """N engines on one GPU: one engine's limits and plan (all are alike) and the remainder."""

    engines: int
    total_bytes: int
    limits: EngineLimits
    engine: MemoryPlan
    overhead_bytes: int
    margin_bytes: int
    mps_bytes: int
    layout_bytes: int
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

    @property
    def footprint_bytes(self) -> int:
        """One engine at load as measured: its KV cache and the measured overhead."""
        return self.engine.kv_bytes + self.overhead_bytes


def plan_engines(
    shape: ModelShape,
    total_bytes: int,
    engines: int,
    *,
    geforce: bool = False,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    dtype_bytes: int = 2,
    more_graphs: bool = False,
) -> EnginesPlan:
    """Plan `engines` engines on one card of `total_bytes` (1: the profile's own numbers);
    `more_graphs`: the profile records more CUDA graphs than the measured overhead held
    (`memory.more_graphs`), so each engine's KV cache gives up their measured memory."""
    if engines < 1:
        raise ValueError(f"engines per GPU must be 1 or more; got {engines}")
    limits = derive(
        total_bytes,
        shape,
        geforce=geforce,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    limits = replace(limits, dtype_bytes=dtype_bytes, more_graphs=more_graphs)
    layout = layout_share(total_bytes)
    if engines == 1:
        engine = plan(shape, limits, total_bytes)
        left = cuda_total(total_bytes) - engine.budget_bytes - layout
        return EnginesPlan(
            1, total_bytes, limits, engine, 0, 0, 0, layout, left, engine.errors, engine.warnings
        )
    total = cuda_total(total_bytes)
    usable = total - MPS_SERVER_BYTES - layout
    each = usable // engines
    # the measured overhead held vLLM's default graphs; what the profile records beyond them
    overhead = ENGINE_OVERHEAD_BYTES + graph_bytes(limits) - CUDA_GRAPH_BYTES
    kv = (each - overhead - ENGINE_MARGIN_BYTES) // MiB * MiB
    share = min(math.floor(UTILIZATION_CAP / engines * 100), math.floor(each / total * 100)) / 100
    limits = replace(limits, gpu_memory_utilization=share, kv_cache_memory_bytes=kv)
    engine = plan(shape, limits, total_bytes)
    seqs = max(8, min(MAX_NUM_SEQS_CAP, engine.concurrent_pages) // 8 * 8)
    limits = replace(limits, max_num_seqs=seqs)
    engine = plan(shape, limits, total_bytes)
    errors = list(engine.errors)
    if kv <= 0:
        errors.insert(
            0,
            f"cannot start: {engines} engines leave no KV cache: each has {each / GiB:.2f} GiB "
            f"beside the MPS server and the layout service, and needs "
            f"{(overhead + ENGINE_MARGIN_BYTES) / GiB:.2f} GiB before its KV cache "
            "(measured overhead and margin, app/profiles/engines.py)",
        )
        limits = replace(limits, kv_cache_memory_bytes=None)
    left = usable - engines * (max(kv, 0) + overhead)
    return EnginesPlan(
        engines=engines,
        total_bytes=total_bytes,
        limits=limits,
        engine=engine,
        overhead_bytes=overhead,
        margin_bytes=ENGINE_MARGIN_BYTES,
        mps_bytes=MPS_SERVER_BYTES,
        layout_bytes=layout,
        left_bytes=left,
        errors=tuple(errors),
        warnings=engine.warnings,
    )


def profile_more_graphs(profile: str | None) -> bool:
    """Whether vllm_configs/PROFILE.yaml records more CUDA graphs than vLLM's default."""
    if profile is None:
        return False
    path = ROOT / PROFILES_DIR / f"{profile}.yaml"
    if not path.is_file():
        return False
    return more_graphs(yaml.safe_load(path.read_text()).get("compilation-config"))


def plan_for_card(card: Card, shape: ModelShape, engines: int) -> EnginesPlan:
    """`plan_engines` for a catalogue card, with the graphs its profile records."""
    return plan_engines(
        shape,
        card.memory_bytes,
        engines,
        geforce=card.geforce,
        more_graphs=profile_more_graphs(card.profile),
    )
