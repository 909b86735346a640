"""How the packed encoder attends inside each image: `OCRVL_PLUGIN_VIT_ATTENTION` picks one.

- `vllm` (the default): vLLM's own `MMEncoderAttention` over the packed sequence, with the
  backend vLLM picked (flash-attn varlen on an H200; TORCH_SDPA on the CPU; vLLM's own
  `--mm-encoder-attn-backend` chooses another, e.g. FLASHINFER, where its wheels are installed).
  Inside vLLM on an H200 it was the fastest of the four on pages and on blocks (pass 14,
  engine/vllm_plugin/README.md): the plain-torch gains below were against torch's FlashAttention
  2, vLLM runs FlashAttention 3 there.
- `sdpa`: torch's SDPA once per image, torch choosing the kernel.
- `cudnn`: the same with SDPA's cuDNN kernel first (flash, memory-efficient, math behind it, for
  shapes cuDNN refuses); on an H200 at head dim 72 cuDNN ran a page's attention 1.75x faster
  than flash (issue 50, measured in plain torch).
- `grouped`: a step's images grouped by size, each group one batched SDPA call, cuDNN first:
  equal-size blocks as one call cost 4.5x less per image than a flash call per image.

Every mode keeps attention inside each image, so the embeddings equal vLLM's within the float
tolerance of a different kernel (tests/engine/test_vllm_plugin.py checks each one on the CPU,
where SDPA's math and CPU-flash kernels stand in for the GPU's).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch
import torch.nn.functional as F

ENV = "OCRVL_PLUGIN_VIT_ATTENTION"
MODES = ("vllm", "sdpa", "cudnn", "grouped")

# (q, k, v as (1, patches, heads, head_dim), each image's patches, scale) -> like q
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Sequence[int], float], torch.Tensor]


def mode() -> str:
    """The mode the environment asks for; ValueError naming the choices for any other."""
    chosen = os.environ.get(ENV, "").strip().lower() or "vllm"
    if chosen not in MODES:
        raise ValueError(f"{ENV}={chosen!r} is not a mode: use one of {', '.join(MODES)}")
    return chosen


def kernels(chosen: str) -> AbstractContextManager[object]:
    """SDPA's kernel order for `chosen`: cuDNN first for `cudnn` and `grouped` (on the CPU, which
    has no cuDNN kernel, SDPA takes the next it has); torch's own choice for `sdpa`."""
    if chosen == "sdpa":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # fmt: skip
    return sdpa_kernel(order, set_priority=True)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA over (batch, n, heads, dim) tensors, answered in that layout."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale
    )
    return out.transpose(1, 2)


def per_image(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], scale: float, *,
    chosen: str = "sdpa",
) -> torch.Tensor:  # fmt: skip
    """One SDPA call per image (`sdpa`, `cudnn`: `chosen` picks the kernel order)."""
    with kernels(chosen):
        parts = [
            _sdpa(qi, ki, vi, scale)
            for qi, ki, vi in zip(
                q.split(lengths, 1), k.split(lengths, 1), v.split(lengths, 1), strict=True
            )
        ]
    return torch.cat(parts, dim=1)


def grouped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], scale: float
) -> torch.Tensor:
    """Images of one size stacked into one batched SDPA call per size (`grouped`)."""
    if len(set(lengths)) == 1:  # the whole step is one group: a view, no copy
        n = lengths[0]
        shape = (len(lengths), n, *q.shape[2:])
        with kernels("grouped"):
            return _sdpa(q.reshape(shape), k.reshape(shape), v.reshape(shape), scale).reshape(
                q.shape
            )
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    members: dict[int, list[int]] = {}
    for image, n in enumerate(lengths):
        members.setdefault(n, []).append(image)
    out = torch.empty_like(q)
    with kernels("grouped"):
        for n, images in members.items():
            spans = [slice(starts[i], starts[i] + n) for i in images]
            stacked = [torch.stack([t[0, s] for s in spans]) for t in (q, k, v)]
            answer = _sdpa(*stacked, scale)
            for row, span in enumerate(spans):
                out[0, span] = answer[row]
    return out


def for_mode(chosen: str) -> Attend | None:
    """The attention `chosen` names; None for `vllm` (vLLM's own MMEncoderAttention)."""
    if chosen == "vllm":
        return None
    if chosen == "grouped":
        return grouped
    return partial(per_image, chosen=chosen)
