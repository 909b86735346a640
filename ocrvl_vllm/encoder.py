"""PaddleOCR-VL with every image of an engine step encoded in one pass, its shapes kept on the host.

vLLM's class (0.23) encodes the images of a step one at a time, and each image stops the CPU
until the GPU has caught up several times: `image_grid_thw.tolist()` on a GPU tensor, blocking
copies of `cu_seqlens` and the position ids, `pids.max()` feeding `torch.arange`, the projector
unpacking grid sizes from a GPU tensor, and `max_seqlen.item()` in every one of the 27 encoder
layers. With asynchronous scheduling the next step's CPU work should overlap the GPU's; every
sync turns that back into taking turns. Here everything the kernels need to know about shapes
comes from the grids on the host (vLLM keeps them on the CPU), the host tensors are pinned and
copied without blocking, `max_seqlen` stays a CPU tensor (its `.item()` costs nothing), and all
the step's images go through the tower as one sequence batch split by `cu_seqlens`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.models.paddleocr_vl import (
    PaddleOCRVLDummyInputsBuilder,
    PaddleOCRVLForConditionalGeneration,
    PaddleOCRVLMultiModalProcessor,
    PaddleOCRVLProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig

Grid = tuple[int, int, int]


class PaddleOCRVLHostGrids(PaddleOCRVLMultiModalProcessor):
    """vLLM's processor, with `image_grid_thw` kept on the CPU for the model (as 0.32 does)."""

    def _get_mm_fields_config(
        self, hf_inputs: Any, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        return {
            "pixel_values": MultiModalFieldConfig.batched("image"),
            "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
        }


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied from pinned memory without blocking the CPU."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def positions(grids: Sequence[Grid]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every patch of every image, in the order the tower sees them (host)."""
    patches = torch.cat([torch.arange(t * h * w) % (h * w) for t, h, w in grids])
    widths = torch.cat([torch.full((t * h * w,), w) for t, h, w in grids])
    return patches // widths, patches % widths


@MULTIMODAL_REGISTRY.register_processor(
    PaddleOCRVLHostGrids,
    info=PaddleOCRVLProcessingInfo,
    dummy_inputs=PaddleOCRVLDummyInputsBuilder,
)
class PaddleOCRVLBatched(PaddleOCRVLForConditionalGeneration):
    """vLLM's PaddleOCR-VL whose vision tower runs once per step and never waits on the GPU."""

    def _process_image_input(self, image_input: Any) -> Sequence[torch.Tensor]:
        grid_thw = image_input.image_grid_thw  # kept on the CPU: reading it costs no sync
        listed = grid_thw.tolist() if isinstance(grid_thw, torch.Tensor) else grid_thw
        grids: list[Grid] = [tuple(int(v) for v in g) for g in listed]
        pixel_values = image_input.pixel_values
        pixels = torch.cat(list(pixel_values)) if len(grids) > 1 else pixel_values[0]
        vision = self.visual.vision_model
        pixels = pixels.type(self.visual.dtype)
        device = pixels.device
        sizes = [t * h * w for t, h, w in grids]
        rows, columns = (_to(ids, device) for ids in positions(grids))
        offsets = torch.tensor([0, *sizes], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu_seqlens = _to(offsets, device)
        max_seqlen = torch.tensor(max(sizes), dtype=torch.int32)  # a CPU tensor: .item() is free

        hidden = vision.embeddings(
            pixels, interpolate_pos_encoding=True, position_ids=columns, image_grid_thw=grids
        )
        table = vision.encoder.rotary_pos_emb(max(max(h, w) for _, h, w in grids))
        rotary = table[torch.stack([rows, columns], dim=-1)].flatten(1)
        for layer in vision.encoder.layers:
            hidden = layer(
                hidden, cu_seqlens=cu_seqlens, rotary_pos_emb=rotary, max_seqlen=max_seqlen
            )
        hidden = vision.post_layernorm(hidden)
        features = hidden.squeeze(0).split(sizes)
        return self.mlp_AR(features, grids)
