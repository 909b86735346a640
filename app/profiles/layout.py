"""The layout service's share of the GPU it shares with vLLM (`engine/layout`, issue 36).

PP-DocLayoutV3 runs beside the engines on the same GPU: its own process, so its own CUDA
context, then its weights and the activations of its largest batch, and what PyTorch's caching
allocator keeps beyond them. Its peak allocated memory was measured on an H200 (bf16,
800 x 800 input, transformers' own `PPDocLayoutV3ForObjectDetection`, after warm-up:
docs/gpu-profiles.md, "The layout service's share"):

    batch      1      8     32     64
    peak GiB   0.6    3.0   11.8   23.6      (torch.compile'd, batch 8: 2.4)

A straight line through them, 0.23 GiB + 0.37 GiB per page, is above every point but batch 8
(3.19 vs 3.0), so the peak stays on the safe side.

The caching allocator keeps more than that peak: what it reserves is the peak plus the blocks it
split and keeps cached. Three H200 runs of the service at batch 8 (default allocator, eager)
measured it:

    tenth pass      beside the two engines under MPS: 5.80 GiB in all after a 40 s window
                    (context ~0.75, so ~5.05 GiB reserved): 1.58x the modelled peak of 3.19 GiB
                    (gpu-h200-2026-12-02-pass10.md)
    eleventh pass   beside them: 5,606 MiB in all over 120 s: PyTorch's peak allocated 3,155 MiB,
                    reserved 4,840 MiB, its context 766 MiB; 4,840 MiB is 1.48x the modelled
                    peak (1.53x its own measured peak) (gpu-h200-2026-12-03-pass11.md)
    thirteenth pass alone on the card, 64 clients for 120 s (window 02-layout-c64): 6,486 MiB in
                    all: peak allocated 3,149 MiB, reserved 5,722 MiB, its context 764 MiB;
                    5,722 MiB is 1.75x the modelled peak of 3,267 MiB (1.82x its own measured
                    peak) (gpu-h200-2026-12-03-pass13.md)

    seventeenth     in CUDA graphs (the service's default on a GPU), alone on an H100, 64
                    clients for 120 s: reserved 5,670 MiB at most, peak allocated 3,202 MiB:
                    1.74x the modelled peak (gpu-h100-2026-12-05-layout-memory.md). Before
                    the graphs' outputs stopped holding every decoder layer's masks it was
                    7,072 MiB, 2.16x, on the H200 (gpu-h200-2026-12-05-layout-graphs.md)

so the share counts the allocator's reserve as `RESERVED_OVER_PEAK` (1.85, above all four
ratios) times the modelled peak:

    share = context + 1.85 x (0.23 + 0.37 x max batch + preprocessing at max batch) GiB

The preprocessing term is the orientation and unwarping models the service loads beside the
layout model (issue 49): modelled, not measured on a GPU, from their parameter counts and their
forward passes' peaks on the CPU (app/profiles/preprocess.py): 0.66 GiB + 30 MiB a page, most
of it flattening one 12 M pixel photo at its own size. At the service's largest batch
(`--max-batch`, 8 by default) the share is 0.75 + 1.85 x (3.19 + 0.87) = 8.25 GiB; the layout
model's part alone, 0.75 + 1.85 x 3.19 = 6.65 GiB, is above the largest process total measured
(6,486 MiB = 6.33 GiB, without the preprocessing models). Every GPU profile keeps the share
outside vLLM's budget (`memory.utilization_for`, `engines.plan_engines`). History: the share was
the peak alone, 0.75 + 3.19 = 3.94 GiB, through the eleventh pass, 0.75 + 1.65 x 3.19 = 6.01 GiB
through the twelfth, which the thirteenth pass's 6.33 GiB exceeded, and 6.65 GiB until the
preprocessing models were counted.

A small card keeps room for a smaller batch (`layout_batch_for`): the largest of 8, 4, 2 whose
share is at most a third of the card, so that its one engine keeps a useful KV cache. The 12 GB
RTX 3060 gets 1 (3.08 GiB), the 16 GB T4 2 (3.82 GiB), every card of 20 GiB and more 8. The
profile's header gives the batch, `make serve` reads it, and compose's
`compose/engines/<profile>.env` holds it.

Compiled (torch.compile) the service reserves less: at batch 8 in the thirteenth pass 4,665 and
4,123 MiB in all, reserved 3,860 and 3,328 MiB over peaks of 2,476 and 2,449 MiB (two windows).
With `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` the eleventh pass measured it at
4,056 MiB in all (reserved 3,292 MiB), but alone on the card, not under MPS. The share keeps the
eager default's figure; either, once measured under MPS, could lower the factor.

The context is measured: beside the two engines of the ninth pass (H200, under MPS) the service
held 1.62 GiB, of which PyTorch had 686 MiB allocated and 208 MiB reserved, so 0.75 GiB was
non-PyTorch memory (its CUDA context, cuBLAS/cuDNN workspaces): the OOM report in
layout-8300.cut.log of bench/results/gpu-h200-2026-12-02-pass9-raw/pass-raw.tar.gz. It got
1.69 GiB in all, because the engines took the rest, and failed its first batch (5 pages).
"""

from __future__ import annotations

from app.profiles.preprocess import preprocess_peak_bytes
from app.profiles.shapes import GiB

LAYOUT_BASE_BYTES = round(0.23 * GiB)
"""The peak less its per-page part: weights (33.2 M parameters, 63 MiB in bf16) and workspaces."""
LAYOUT_PAGE_BYTES = round(0.37 * GiB)
"""Activations per 800 x 800 page in a batch (bf16; fp32 would need about twice)."""
LAYOUT_MAX_BATCH = 8
"""The layout service's default `--max-batch`, and the largest batch a profile makes room for."""
LAYOUT_BATCHES = (8, 4, 2, 1)
"""The batches a profile may give the layout service, largest first (`layout_batch_for`)."""
LAYOUT_SHARE_OF_CARD = 1 / 3
"""The most of a card (CUDA's total) the layout service's share may take; the rest is vLLM's."""
LAYOUT_CONTEXT_BYTES = 3 * GiB // 4
"""Its own CUDA context and non-PyTorch memory: 0.75 GiB measured on the H200 (above)."""
RESERVED_OVER_PEAK = 1.85
"""What PyTorch's caching allocator reserves over the modelled peak allocated memory: measured
1.58x (tenth pass) and 1.48x (eleventh) at batch 8 on the H200 under MPS, 1.75x (thirteenth)
alone on it (above); 1.85 keeps ~6 % above the largest. It was 1.65 through the twelfth pass."""


def layout_model_peak_bytes(max_batch: int) -> int:
    """PP-DocLayoutV3's modelled peak at `max_batch` pages per forward pass (measured above)."""
    return LAYOUT_BASE_BYTES + max_batch * LAYOUT_PAGE_BYTES


def layout_bytes(max_batch: int = LAYOUT_MAX_BATCH) -> int:
    """The layout service's share of a GPU at `max_batch` pages per forward pass: its context
    and what the caching allocator reserves for the layout model's peak and the preprocessing
    models' (orientation and unwarping)."""
    if max_batch < 1:
        raise ValueError(f"the layout service's max batch must be 1 or more; got {max_batch}")
    peak = layout_model_peak_bytes(max_batch) + preprocess_peak_bytes(max_batch)
    return LAYOUT_CONTEXT_BYTES + round(RESERVED_OVER_PEAK * peak)


def layout_batch_for(cuda_total_bytes: int) -> int:
    """The layout service's `--max-batch` on a card of this CUDA total: the largest of 8, 4, 2
    whose share is at most a third of the card, else 1.

    A card of 20 GiB or more gets the default 8 (8.25 GiB); a 16 GB T4 (14.40 GiB) gets 2 (3.82
    GiB), a 12 GB RTX 3060 (11.40 GiB) 1 (3.08 GiB): docs/gpu-profiles.md, "The layout service's
    share".
    """
    for batch in LAYOUT_BATCHES:
        if layout_bytes(batch) <= cuda_total_bytes * LAYOUT_SHARE_OF_CARD:
            return batch
    return LAYOUT_BATCHES[-1]
