"""The layout service's share of the GPU it shares with vLLM (`engine/layout`, issue 36).

PP-DocLayoutV3 runs beside the engines on the same GPU: its own process, so its own CUDA
context, then its weights and the activations of its largest batch. Measured on an H200 (bf16,
800 x 800 input, transformers' own `PPDocLayoutV3ForObjectDetection`, peak allocated memory
after warm-up: docs/gpu-profiles.md, "The layout service's share"):

    batch      1      8     32     64
    peak GiB   0.6    3.0   11.8   23.6      (torch.compile'd, batch 8: 2.4)

A straight line through them, 0.23 GiB + 0.37 GiB per page, is above every point but batch 8
(3.19 vs 3.0), so the model stays on the safe side. The share is that peak at the service's
largest batch (`--max-batch`, 8 by default) plus one CUDA context; every GPU profile keeps it
outside vLLM's budget (`memory.utilization_for`, `engines.plan_engines`).

The context is measured: beside the two engines of the ninth pass (H200, under MPS) the service
held 1.62 GiB, of which PyTorch had 686 MiB allocated and 208 MiB reserved, so 0.75 GiB was
non-PyTorch memory (its CUDA context, cuBLAS/cuDNN workspaces): the OOM report in
layout-8300.cut.log of bench/results/gpu-h200-2026-12-02-pass9-raw/pass-raw.tar.gz. It got
1.69 GiB in all, because the engines took the rest, and failed its first batch (5 pages): the
share below is what it needs, 3.94 GiB at batch 8.
"""

from __future__ import annotations

from app.profiles.shapes import GiB

LAYOUT_BASE_BYTES = round(0.23 * GiB)
"""The peak less its per-page part: weights (33.2 M parameters, 63 MiB in bf16) and workspaces."""
LAYOUT_PAGE_BYTES = round(0.37 * GiB)
"""Activations per 800 x 800 page in a batch (bf16; fp32 would need about twice)."""
LAYOUT_MAX_BATCH = 8
"""The layout service's default `--max-batch`: the batch the profiles make room for."""
LAYOUT_CONTEXT_BYTES = 3 * GiB // 4
"""Its own CUDA context and non-PyTorch memory: 0.75 GiB measured on the H200 (above)."""


def layout_bytes(max_batch: int = LAYOUT_MAX_BATCH) -> int:
    """The layout service's share of a GPU at `max_batch` pages per forward pass."""
    if max_batch < 1:
        raise ValueError(f"the layout service's max batch must be 1 or more; got {max_batch}")
    return LAYOUT_CONTEXT_BYTES + LAYOUT_BASE_BYTES + max_batch * LAYOUT_PAGE_BYTES
