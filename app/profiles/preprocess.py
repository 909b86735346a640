"""The layout service's document preprocessing models in its share of the GPU (issue 49).

The service loads PP-LCNet_x1_0_doc_ori (orientation, 1.68 M parameters) and UVDoc (unwarping,
7.90 M) beside PP-DocLayoutV3 by default (`make serve`, compose and Kubernetes name PaddlePaddle's
checkpoints), on the same device, and runs them on a request's pages in the thread that runs the
layout batches (engine/layout/ocrvl_layout/preprocess.py), at most a layout batch a pass. Their
share is **modelled, not measured on a GPU**: from their parameter counts and from the peak
memory of their forward passes on the CPU (the engine venv's torch and transformers 5.19, fp32,
one thread, the high-water mark of the process's resident memory around one forward pass), at
the sizes they run at:

    orientation  PP-LCNet at 224 x 224 a page (orientation.py's CROP)
                 batch 1: 24.2 MiB, batch 8: 90.2 MiB -> 14.8 MiB + 9.4 MiB a page
    unwarping    UVDoc at 712 x 488 a page (unwarping.py's INPUT)
                 batch 1: 63.9 MiB, batch 8: 199.7 MiB -> 44.5 MiB + 19.4 MiB a page
    resampling   each page flattened at its own size, one page at a time, in fp32: the page, the
                 mesh upsampled to it, grid_sample's output, its bytes: 47.2 bytes a pixel
                 measured on a 4,000 x 3,000 page; 48 counted

fp32 is about twice the bf16 the service runs in on a GPU, which keeps the figures on the safe
side. The model, per pass of `batch` pages:

    weights      9.58 M parameters x 4 bytes (fp32; 18 MiB in bf16)       37 MiB
    fixed        14.8 + 44.5 MiB, rounded up                               60 MiB
    a page       9.4 + 19.4 MiB, rounded up                                30 MiB x batch
    resampling   one 12 M pixel page (a 4,000 x 3,000 phone photo, what
                 unwarping is for) x 48 bytes                             549 MiB

At batch 8 that is 37 + 60 + 240 + 549 = 886 MiB (0.87 GiB). The preprocessing passes and the
layout passes never overlap (Batcher.exclusive), but the caching allocator keeps the blocks the
first freed, which the second's differently sized blocks need not reuse, so the share adds the
two peaks and counts the allocator's reserve (`RESERVED_OVER_PEAK`) over both. A larger page
takes 48 bytes a pixel more for its resampling: the service's 60 M pixel cap (`--max-pixels`)
would take 2.7 GiB, beyond the share; unwarping is off unless a request asks for it.
"""

from __future__ import annotations

MiB = 1024**2

ORIENTATION_PARAMETERS = 1_677_000
"""PP-LCNet_x1_0_doc_ori: transformers' `PPLCNetForImageClassification` with four labels."""
UNWARPING_PARAMETERS = 7_900_000
"""UVDoc: transformers' `UVDocModel` in its default configuration (tiny_preprocess.py's)."""
PREPROCESS_WEIGHT_BYTES = (ORIENTATION_PARAMETERS + UNWARPING_PARAMETERS) * 4
"""Both models' weights in fp32 (the safe side of the bf16 they load in on a GPU)."""
PREPROCESS_FIXED_BYTES = 60 * MiB
"""Both forward passes' peak less their per-page part, measured on the CPU (above)."""
PREPROCESS_PAGE_BYTES = 30 * MiB
"""Both forward passes' activations per page in a pass, measured on the CPU (above)."""
RESAMPLE_BYTES_PER_PIXEL = 48
"""Flattening a page along UVDoc's mesh at its own size, in fp32: 47.2 measured (above)."""
RESAMPLE_PIXELS = 4_000 * 3_000
"""The page the share makes room to flatten: a 12 M pixel phone photo."""


def preprocess_peak_bytes(batch: int) -> int:
    """The preprocessing models' modelled peak at `batch` pages per pass: their weights, both
    forward passes, and one page's resampling."""
    return (
        PREPROCESS_WEIGHT_BYTES
        + PREPROCESS_FIXED_BYTES
        + batch * PREPROCESS_PAGE_BYTES
        + RESAMPLE_PIXELS * RESAMPLE_BYTES_PER_PIXEL
    )
