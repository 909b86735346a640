"""vLLM 0.32's `PaddleOCRVLForConditionalGeneration` with its vision encoder run packed.

The subclass keeps everything of vLLM's class (processor, weights and their names, the language
model, M-RoPE, the multimodal embedding contract) and replaces one method,
`_process_image_input`, which vLLM runs once per engine step with every image of that step.
vLLM's version loops `encode_image` over the images, one ViT call each, then the projector once
per image. Here `PackedEncoder` (encoder.py) drives the same modules once for the whole step.

What differs from vLLM's forward, and why the numbers stay equal:

1. One ViT call over all images, `cu_seqlens` marking where each starts. Attention is the only
   step that mixes patches, and MMEncoderAttention keeps it inside each image on every backend
   vLLM picks (flash-attn / Triton varlen on CUDA; SDPA splits by `cu_seqlens` on CPU and on
   CUDA's TORCH_SDPA). Every other step (patch embedding, LayerNorm, linear, GELU, residual)
   works row by row. Differences: only matrix-multiply tiling over a longer M (fp32 ~1e-6).
2. Position embeddings: vLLM's own `interpolate_pos_encoding`, once per (h, w) grid, kept in a
   64 MiB least-recently-used cache (cleared when weights load) instead of per image per call.
   The same function of the same weights: the same values.
3. Rotary position ids are built on the host with numpy from the grids vLLM keeps on the host
   (one copy to the device per call, not one `arange` chain per image); the angle table, its
   gather and cos/sin run once per call instead of in each of the 27 layers. Same integers, the
   same float ops on the same inputs.
4. The rotary is applied to the q/k half of the packed qkv projection (a view), not to a
   `torch.cat` of q and k: vLLM's ApplyRotaryEmb module itself runs on the view, in fp32 as in
   vLLM's class. On CUDA (unless OCRVL_PLUGIN_FUSED_ROTARY=0) the plugin's Triton kernel
   (rotary.py) rotates the view in place instead: fp32 math on fp32 cos/sin in the expression
   order of flash-attn's kernel, rounded once to the model dtype, which is what
   `enable_fp32_compute` computes with an fp32 copy in and a cast out (four kernels a layer in
   an H100 profile). Bit-identical in Triton's CPU interpreter and, on an H100, on whole pages
   (bench.gpu.encoder_check, the twenty-third pass).
5. `max_seqlen` for the varlen kernels is a host tensor (as qwen2_5_vl passes it), so their
   `.item()` reads no device memory: no device sync per layer. Same value.
6. The projector (mlp_AR) runs once: pre-norm over all patches (row-wise), the 2x2 spatial
   merge as one `index_select` in the order einops' `(t h p1 w p2) d -> (t h w) (p1 p2 d)`
   gives per image (packing.py builds it), then linear_1, GELU, linear_2 once. The output is
   split by each image's token count (t*h*w/4), one tensor per image, in order.
7. `OCRVL_PLUGIN_VIT_ATTENTION` (attention.py) may replace vLLM's MMEncoderAttention by torch's
   SDPA per image (`sdpa`, `cudnn`) or per group of equal-size images (`grouped`): attention
   still stays inside each image, only the kernel (and its float rounding) differs.
8. With tensor parallelism > 1 each layer calls vLLM's own SiglipAttention (which gathers q/k/v
   across ranks) with the packed sequence; only 4 above is then not applied.
9. Pixels are rescaled and normalised on the device (`supports_mm_device_do_normalize`, on unless
   `--no-mm-device-do-normalize`): the API server's image processor then skips its rescale and
   normalise and sends the patches as uint8 (a quarter of float32's bytes to serialise, copy to
   the engine and on to the GPU), and vLLM's FusedMMInputNorm computes `x * (1/255/std) -
   mean/std` in fp32 before the patch embedding, as vLLM's Qwen2-VL family does. The same affine
   map of the same integers as the processor's `(x/255 - mean)/std`, one rounding apart (fp32).
10. Opt-in (`--compilation-config '{"cudagraph_mm_encoder": true}'`), vLLM's encoder graph
   manager replays `PackedEncoder.run` recorded over buffers (graphs.py): the same kernels on the
   same values, the buffers zero-padded past the batch's patches, which belong to no image.

The layer loop in encoder.py restates SiglipEncoderLayer.forward (norm, attention, residual,
norm, MLP, residual) around the new attention; no other vLLM code is copied.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar, Literal

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.layers.fusion.mm_input_norm import build_mm_input_norm
from vllm.model_executor.models.interfaces import MultiModalEmbeddings, SupportsEncoderCudaGraph
from vllm.model_executor.models.paddleocr_vl import (
    PaddleOCRImagePixelInputs,
    PaddleOCRVLForConditionalGeneration,
)

from ocrvl_vllm_plugin import graphs
from ocrvl_vllm_plugin.encoder import PackedEncoder

logger = init_logger("vllm.ocrvl_vllm_plugin")

IN_USE = "PaddleOCR-VL packed vision encoder in use (plugin ocrvl_packed_encoder)"


class PackedPaddleOCRVLForConditionalGeneration(
    PaddleOCRVLForConditionalGeneration, SupportsEncoderCudaGraph
):
    """vLLM's PaddleOCR-VL, its images encoded in one packed ViT call per step; with vLLM's
    `cudagraph_mm_encoder` that call replays a CUDA graph (graphs.py, opt-in)."""

    supports_mm_device_do_normalize = True  # read by vLLM's registry: 9 above
    supports_encoder_cudagraph: ClassVar[Literal[True]] = True  # used only if switched on

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # A plain object holding the same modules: no second copy of any parameter
        norm = build_mm_input_norm(vllm_config.model_config)  # identity unless on the device
        self.packed_encoder = PackedEncoder(self.visual, self.mlp_AR, norm)
        where = "on the host" if norm.input_dtype is None else "on the device"
        rotary = "vLLM's fp32" if self.packed_encoder.rotate is None else "the plugin's fused"
        logger.info(
            "%s; ViT attention %s; pixels normalised %s; rotary %s",
            IN_USE, self.packed_encoder.mode, where, rotary,
        )  # fmt: skip

    def _process_image_input(self, image_input: PaddleOCRImagePixelInputs) -> MultiModalEmbeddings:
        return self.packed_encoder(image_input.pixel_values, image_input.image_grid_thw)

    # SupportsEncoderCudaGraph (vLLM reads these only with cudagraph_mm_encoder): graphs.py

    def get_encoder_cudagraph_config(self) -> Any:
        graphs.check(self.packed_encoder)
        return graphs.config(self.config.text_config.hidden_size)

    def get_encoder_cudagraph_budget_range(self, vllm_config: VllmConfig) -> tuple[int, int]:
        return graphs.budget_range(vllm_config)

    def get_encoder_cudagraph_item_specs(self, mm_kwargs: dict[str, Any]) -> Any:
        return graphs.item_specs(mm_kwargs, self.packed_encoder.merge)

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        return graphs.select(mm_kwargs, indices)

    def prepare_encoder_cudagraph_capture_inputs(  # noqa: PLR0917 (vLLM's signature)
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> Any:
        return graphs.capture(self.packed_encoder, token_budget, max_batch_size, device)

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> Any:
        return graphs.replay(self.packed_encoder, mm_kwargs)

    def encoder_cudagraph_forward(
        self, values: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        return graphs.forward(self.packed_encoder, values)

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        return graphs.eager(self.packed_encoder, mm_kwargs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        self.packed_encoder.positions.clear()  # tables interpolated from the old weights
        return loaded
