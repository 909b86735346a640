"""vLLM plugin: PaddleOCR-VL's vision encoder replayed from CUDA graphs (vLLM 0.32 only).

vLLM 0.32 can capture a vision encoder as one CUDA graph per token budget and replay it
(`--compilation-config '{"cudagraph_mm_encoder": true}'`, vllm/v1/worker/encoder_cudagraph.py),
but only for models implementing `SupportsEncoderCudaGraph`; its PaddleOCR-VL does not, and
encodes image by image in eager mode (27 SigLIP layers of small kernels, a host sync per layer
for flash attention's `max_seqlen`). `PaddleOCRVLGraphs` implements the protocol:

* outside the graph, per batch of images: the concatenated patches, each image's interpolated
  position embedding (vLLM's own `interpolate_pos_encoding`), the (row, column) rope positions,
  `cu_seqlens` (padded with its last value: empty sequences, as Qwen2-VL does) and the
  projector's 2x2 merge order as a gather index, all into fixed-shape buffers;
* inside the graph: patch embedding, the encoder layers, the post norm and the projector, with
  shapes fixed by the budget and no host syncs (`max_seqlen` is a CPU scalar fixed at capture:
  4 x the smaller of the budget and the largest image's tokens).

Padding rows belong to no sequence, so they never reach a real image's attention, and every
other step is per row; the manager slices the real images' rows out of the output.

`register` (the `vllm.general_plugins` entry point that bench/gpu_layouts.py's `graphs` layout
installs) swaps the class in only with OCRVL_ENCODER_GRAPHS=1 on vLLM 0.32.x.

Measured on an H200 (docs/benchmarks.md, fifth pass): 7 graphs captured, 1.04x one engine's
peak pages/s (1.20x with two API servers), 2.03 GiB of graph memory; so it stays a bench
experiment, not part of the profiles.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.interfaces import SupportsEncoderCudaGraph
from vllm.model_executor.models.paddleocr_vl import PaddleOCRVLForConditionalGeneration
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker.encoder_cudagraph_defs import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)

ARCHITECTURE = "PaddleOCRVLForConditionalGeneration"
SWITCH = "OCRVL_ENCODER_GRAPHS"
TESTED = "0.32."  # the release whose PaddleOCR-VL and encoder-graph internals this follows
MERGE = 2  # the projector's 2x2 merge (vLLM's Projector hard-codes it)
# Attention backends whose varlen kernels leave rows past cu_seqlens[-1] alone and take
# max_seqlen from the host: the only ones a captured graph can use.
VARLEN = {
    AttentionBackendEnum.FLASH_ATTN,
    AttentionBackendEnum.ROCM_AITER_FA,
    AttentionBackendEnum.TRITON_ATTN,
}
BUFFERS = [
    "pixel_values",
    "pos_embeds",
    "rope_positions",
    "cu_seqlens",
    "max_seqlen",
    "merge_index",
]

log = logging.getLogger("vllm.ocrvl_encoder_graphs")  # under vLLM's logger: its handler

Grid = tuple[int, int, int]


def _copy_prefix(dst: torch.Tensor, src: torch.Tensor) -> None:
    """cu_seqlens: the replay's entries over the captured ones; SDPA's extra last one kept."""
    dst[: src.shape[0]].copy_(src)


def _merge_order(t: int, h: int, w: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Rows in the projector's order: "(t h p1 w p2) -> (t h w) (p1 p2)", as its rearrange."""
    rows = np.arange(t * h * w, dtype=np.int64).reshape(t, h // MERGE, MERGE, w // MERGE, MERGE)
    return rows.transpose(0, 1, 3, 2, 4).reshape(-1)


def _rope_positions(t: int, h: int, w: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    """(row, column) of each patch, as SiglipEncoder derives them from the grid."""
    ids = np.arange(t * h * w, dtype=np.int32) % (h * w)
    return np.stack([ids // w, ids % w], axis=-1)


class PaddleOCRVLGraphs(PaddleOCRVLForConditionalGeneration, SupportsEncoderCudaGraph):
    """vLLM 0.32's PaddleOCR-VL whose image encoder vLLM may capture and replay as CUDA graphs."""

    supports_encoder_cudagraph: ClassVar[Literal[True]] = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # The most tokens one image can take: it bounds the budgets and attention's max_seqlen.
        info: Any = MULTIMODAL_REGISTRY.get_processing_info(vllm_config.model_config)
        size = info.get_image_size_with_most_features()
        factor = self.config.vision_config.patch_size * MERGE
        self.largest_image_tokens = (size.height // factor) * (size.width // factor)

    # -- what the manager asks once ---------------------------------------------------------

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(
            modalities=["image"],
            buffer_keys=list(BUFFERS),
            out_hidden_size=self.mlp_AR.linear_2.out_features,
            padding_logics={"cu_seqlens": _copy_prefix},
        )

    def get_max_frames_per_video(self) -> int:
        return 1  # images only

    def get_encoder_cudagraph_budget_range(self, vllm_config: VllmConfig) -> tuple[int, int]:
        """Budgets from an eighth of the largest image (157 tokens for the real checkpoint's
        1,256, as the H200 engines logged) up to a step's tokens, capped by the context as
        Qwen2-VL does; the manager doubles from the first, so one page, 2 and 4 pages fill a
        budget exactly."""
        top = min(
            vllm_config.scheduler_config.max_num_batched_tokens,
            vllm_config.model_config.max_model_len,
        )
        return max(1, min(self.largest_image_tokens // 8, top)), top

    # -- per batch: the items --------------------------------------------------------------

    @staticmethod
    def _grids(mm_kwargs: dict[str, Any]) -> list[Grid]:
        grid = mm_kwargs["image_grid_thw"]  # kept on the CPU by vLLM's field config
        rows = grid.tolist() if isinstance(grid, torch.Tensor) else grid
        return [(int(t), int(h), int(w)) for t, h, w in rows]

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict[str, Any]) -> list[EncoderItemSpec]:
        return [
            EncoderItemSpec(input_size=t * h * w, output_tokens=t * (h // MERGE) * (w // MERGE))
            for t, h, w in self._grids(mm_kwargs)
        ]

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        pixel_values = mm_kwargs["pixel_values"]  # one tensor per image, or them stacked
        grid = mm_kwargs["image_grid_thw"]
        chosen = grid[indices] if isinstance(grid, torch.Tensor) else [grid[i] for i in indices]
        return {"pixel_values": [pixel_values[i] for i in indices], "image_grid_thw": chosen}

    # -- the buffers -----------------------------------------------------------------------

    def _attention_backend(self) -> AttentionBackendEnum:
        layer: Any = self.visual.vision_model.encoder.layers[0]
        backend: AttentionBackendEnum = layer.self_attn.attn.attn_backend
        return backend

    def _varlen_attention(self) -> bool:
        return self._attention_backend() in VARLEN

    def _metadata(
        self, grids: Sequence[Grid], max_batch_size: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """Everything data-dependent but the pixels, for images filling the first rows."""
        if len(grids) > max_batch_size:
            raise ValueError(f"{len(grids)} images for a graph of at most {max_batch_size}")
        embeddings = self.visual.vision_model.embeddings
        table = embeddings.position_embedding.weight
        pos_embeds = torch.cat(
            [
                embeddings.interpolate_pos_encoding(table, h, w, True).squeeze(0).repeat(t, 1)
                for t, h, w in grids
            ]
        )
        patches = np.array([t * h * w for t, h, w in grids], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(patches)])
        cu_seqlens = np.full(max_batch_size + 1, offsets[-1], dtype=np.int32)
        cu_seqlens[: len(offsets)] = offsets
        merge = np.concatenate(
            [_merge_order(*g) + o for g, o in zip(grids, offsets[:-1], strict=True)]
        )
        rope = np.concatenate([_rope_positions(*g) for g in grids])
        return {
            "pos_embeds": pos_embeds,
            "rope_positions": async_tensor_h2d(rope, device),
            "cu_seqlens": async_tensor_h2d(cu_seqlens, device),
            "merge_index": async_tensor_h2d(merge, device),
        }

    def prepare_encoder_cudagraph_capture_inputs(  # noqa: PLR0917 (the protocol's signature)
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        """Buffers for `max_batch_size` equal images (1 x 2 x 2k patches) filling the budget."""
        if device.type == "cuda" and not self._varlen_attention():
            backend = self._attention_backend()
            raise RuntimeError(
                f"PaddleOCR-VL encoder CUDA graphs need a varlen ViT attention backend "
                f"({', '.join(b.name for b in VARLEN)}); this engine uses {backend.name}: "
                f"set mm_encoder_attn_backend to FLASH_ATTN, or unset {SWITCH}"
            )
        per_item = -(-token_budget // max_batch_size)  # ceil: never below the budget
        grids = [(1, MERGE, MERGE * per_item)] * max_batch_size
        rows = max_batch_size * MERGE * MERGE * per_item
        config = self.config.vision_config
        pixel_values = torch.zeros(
            rows, config.num_channels, config.patch_size, config.patch_size,
            device=device, dtype=dtype,
        )  # fmt: skip
        values = self._metadata(grids, max_batch_size, device)
        if not self._varlen_attention():
            # SDPA (the CPU's) splits every row into some sequence: one more entry, which no
            # replay overwrites (`_copy_prefix`), closes the padding rows into their own.
            values["cu_seqlens"] = torch.cat(
                [values["cu_seqlens"], values["cu_seqlens"].new_tensor([rows])]
            )
        values |= {
            "pixel_values": pixel_values,
            # Flash attention's launch bound, read on the host at capture and baked into the
            # graph: one image has at most 4 x its tokens in patches, and at most the budget's
            # tokens or the largest image's (a tighter bound launches fewer empty blocks).
            "max_seqlen": torch.tensor(
                MERGE * MERGE * min(token_budget, self.largest_image_tokens), dtype=torch.int32
            ),
        }
        return EncoderCudaGraphCaptureInputs(values=values)

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> EncoderCudaGraphReplayBuffers:
        grids = self._grids(mm_kwargs)
        config = self.config.vision_config
        shape = (-1, config.num_channels, config.patch_size, config.patch_size)
        pixels = torch.cat([image.reshape(shape) for image in mm_kwargs["pixel_values"]])
        values: dict[str, torch.Tensor | None] = {
            **self._metadata(grids, max_batch_size, pixels.device),
            "pixel_values": pixels,  # cast to the buffer's dtype by the manager's copy
            "max_seqlen": None,  # stays the captured bound
        }
        return EncoderCudaGraphReplayBuffers(values=values)

    # -- the forwards ----------------------------------------------------------------------

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        """SigLIP and the projector over fixed-shape buffers: the captured (and replayed) part."""
        vision = self.visual.vision_model
        patch_embedding = vision.embeddings.patch_embedding
        pixel_values = inputs["pixel_values"].to(patch_embedding.weight.dtype)
        hidden = patch_embedding(pixel_values).flatten(-2).squeeze(-1)
        hidden = (hidden + inputs["pos_embeds"]).unsqueeze(0)
        inv_freq = vision.encoder.rotary_pos_emb.get_buffer("inv_freq")
        # SiglipEncoder's table row i is float(i) * inv_freq: the same products, no table
        rotary = (inputs["rope_positions"].to(inv_freq.dtype).unsqueeze(-1) * inv_freq).flatten(1)
        for layer in vision.encoder.layers:
            hidden = layer(
                hidden,
                cu_seqlens=inputs["cu_seqlens"],
                rotary_pos_emb=rotary,
                max_seqlen=inputs["max_seqlen"],
            )
        hidden = vision.post_layernorm(hidden).squeeze(0)
        projector = self.mlp_AR
        hidden = projector.pre_norm(hidden).index_select(0, inputs["merge_index"])
        hidden = projector.linear_1(hidden.view(-1, projector.hidden_size))
        output: torch.Tensor = projector.linear_2(projector.act(hidden))
        return output

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        """vLLM's own per-image path, concatenated as the manager slices a graph's output."""
        image_input = self._parse_and_validate_image_input(**mm_kwargs)
        if image_input is None:
            raise ValueError("encoder_eager_forward needs pixel_values")
        return torch.cat(list(self._process_image_input(image_input)))


def register() -> None:
    """Swap vLLM's PaddleOCR-VL for `PaddleOCRVLGraphs` (OCRVL_ENCODER_GRAPHS=1, vLLM 0.32.x)."""
    if os.environ.get(SWITCH) != "1":
        return
    import vllm  # noqa: PLC0415
    from vllm import ModelRegistry  # noqa: PLC0415

    if not vllm.__version__.startswith(TESTED):
        log.warning(
            "%s=1 but vLLM is %s, not %sx: keeping vLLM's own %s (no encoder CUDA graphs)",
            SWITCH, vllm.__version__, TESTED, ARCHITECTURE,
        )  # fmt: skip
        return
    ModelRegistry.register_model(ARCHITECTURE, "bench.encoder_graphs:PaddleOCRVLGraphs")
    log.info("%s: PaddleOCRVLGraphs (encoder CUDA graphs with cudagraph_mm_encoder)", ARCHITECTURE)
