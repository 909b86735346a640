"""The host-side layout of one packed ViT call: where each image's patches start and end, each
patch's (row, column) in its grid, and the order that gathers 2x2 patch blocks for the projector.

Built with numpy from the grids vLLM keeps on the host (`image_grid_thw` is `keep_on_cpu`), so
nothing here waits on the device; `Packing.to_device` moves it in one copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.utils.torch_utils import async_tensor_h2d

Grid = tuple[int, int, int]  # (t, h, w) in patches, as image_grid_thw holds it


@dataclass(frozen=True)
class Packing:
    """Where each image of a batch sits in the packed sequence of patches."""

    grids: tuple[Grid, ...]
    merge: int  # the projector's spatial merge (2: 2x2 patches make one token)
    cu_seqlens: np.ndarray  # int32 (images + 1,): patch offsets, as MMEncoderAttention takes them
    rows: np.ndarray  # int32 (patches,): each patch's row in its image's grid
    cols: np.ndarray  # int32 (patches,): each patch's column
    merged: np.ndarray  # int32 (patches,): packed patch order that puts each 2x2 block together

    @classmethod
    def of(cls, grids: list[Grid] | tuple[Grid, ...], merge: int) -> Packing:
        """The packing of `grids`, in order."""
        grids = tuple((int(t), int(h), int(w)) for t, h, w in grids)
        sizes = [t * h * w for t, h, w in grids]
        cu_seqlens = np.zeros(len(grids) + 1, dtype=np.int32)
        np.cumsum(sizes, out=cu_seqlens[1:])
        rows, cols, merged = [], [], []
        for (t, h, w), start in zip(grids, cu_seqlens[:-1].tolist(), strict=True):
            within = np.arange(t * h * w, dtype=np.int32) % (h * w)
            rows.append(within // w)
            cols.append(within % w)
            blocks = np.arange(t * h * w, dtype=np.int32).reshape(
                t, h // merge, merge, w // merge, merge
            )
            merged.append(blocks.transpose(0, 1, 3, 2, 4).reshape(-1) + start)
        empty = np.zeros(0, dtype=np.int32)
        return cls(
            grids=grids,
            merge=merge,
            cu_seqlens=cu_seqlens,
            rows=np.concatenate(rows) if rows else empty,
            cols=np.concatenate(cols) if cols else empty,
            merged=np.concatenate(merged) if merged else empty,
        )

    @property
    def patches(self) -> int:
        """Patches in the whole batch."""
        return int(self.cu_seqlens[-1])

    @property
    def max_seqlen(self) -> int:
        """The longest image, in patches (what varlen attention kernels size their grid by)."""
        return int(np.diff(self.cu_seqlens).max(initial=0))

    @property
    def tokens(self) -> list[int]:
        """Each image's tokens after the projector's merge: its slice of the output."""
        return [t * h * w // self.merge**2 for t, h, w in self.grids]

    def to_device(
        self, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """cu_seqlens, rows, cols and merged on `device` (int32), in one host-to-device copy that
        does not block the host (vLLM's async_tensor_h2d stages it in pinned memory)."""
        parts = (self.cu_seqlens, self.rows, self.cols, self.merged)
        placed = async_tensor_h2d(np.concatenate(parts), device=device)
        cu_seqlens, rows, cols, merged = torch.split(placed, [len(p) for p in parts])
        return cu_seqlens, rows, cols, merged
