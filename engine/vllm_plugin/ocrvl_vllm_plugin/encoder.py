"""PaddleOCR-VL's vision tower and projector run packed: every image of a step in one ViT call.

`PackedEncoder` drives the modules vLLM's `PaddleOCRVLForConditionalGeneration` built (same
objects, same weights); what it changes against vLLM 0.32's forward is listed, with why each
change leaves the numbers equal, in `ocrvl_vllm_plugin.model`'s docstring.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from vllm.model_executor.models.paddleocr_vl import (
    Projector,
    SiglipAttention,
    SiglipEncoderLayer,
    SiglipVisionEmbeddings,
    SiglipVisionModel,
)
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from ocrvl_vllm_plugin import attention
from ocrvl_vllm_plugin.packing import Packing

# Interpolated position tables kept per grid. A page at PaddleOCR-VL's largest size (14,400
# patches x 1,152 x bf16) is 33 MB; 64 MiB holds a few pages or many layout blocks, and stays
# small against the memory vLLM leaves outside its own budget.
POSITION_CACHE_BYTES = 64 << 20

# Backends whose kernels take `max_seqlen` (the others are given None, as vLLM's class does).
MAX_SEQLEN_BACKENDS = {
    AttentionBackendEnum.FLASH_ATTN,
    AttentionBackendEnum.ROCM_AITER_FA,
    AttentionBackendEnum.TRITON_ATTN,
}

# (q/k view, cos, sin): rotates the view in place
Rotate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def fused_rotary() -> Rotate | None:
    """The plugin's own in-place Triton rotary (rotary.py: fp32 math on fp32 cos/sin, one kernel
    where vLLM's fp32 ApplyRotaryEmb runs four a layer), on CUDA where triton imports, unless
    OCRVL_PLUGIN_FUSED_ROTARY=0. None (vLLM's ApplyRotaryEmb on the q/k view) elsewhere or when
    turned off. The twenty-third pass (an H100) found its embeddings equal to vLLM's class bit
    for bit on whole pages and read 1.07x the pages/s of vLLM's rotary (the README's "Fused
    rotary"); the tenth pass's fused rotary (flash-attn's kernel, cos/sin cast to bf16) had moved
    greedy answers."""
    if os.environ.get("OCRVL_PLUGIN_FUSED_ROTARY", "1") == "0" or not current_platform.is_cuda():
        return None
    try:  # rotary.py imports triton: only here, never on the plugin's import
        from ocrvl_vllm_plugin import rotary  # noqa: PLC0415
    except ImportError:
        return None
    return rotary.rotate_


class PositionCache:
    """Position embeddings interpolated to a (h, w) grid, least recently used dropped first once
    the tables exceed `budget` bytes."""

    def __init__(self, embeddings: SiglipVisionEmbeddings, budget: int = POSITION_CACHE_BYTES):
        self.embeddings = embeddings
        self.budget = budget
        self.tables: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self.size = 0

    def __call__(self, h: int, w: int) -> torch.Tensor:
        """The (h * w, hidden) table of a grid (vLLM's own interpolation, made once per grid)."""
        table = self.tables.get((h, w))
        if table is not None:
            self.tables.move_to_end((h, w))
            return table
        weight = self.embeddings.position_embedding.weight
        table = self.embeddings.interpolate_pos_encoding(weight, h, w, True).squeeze(0)
        nbytes = table.numel() * table.element_size()
        if nbytes <= self.budget:
            self.tables[(h, w)] = table
            self.size += nbytes
            while self.size > self.budget:
                _, dropped = self.tables.popitem(last=False)
                self.size -= dropped.numel() * dropped.element_size()
        return table

    def clear(self) -> None:
        """Forget every table (the weights changed)."""
        self.tables.clear()
        self.size = 0


@dataclass(frozen=True)
class Layers:
    """One packed call's inputs on the device, everything `PackedEncoder.run` reads: the patches
    as vLLM hands them, each patch's position embedding, where each image starts, the rotary's
    cos/sin (fp32, as vLLM's class computes them) and the projector's 2x2 gather order. An
    encoder CUDA graph (graphs.py) records `run` over buffers of these six tensors and fills
    them before each replay. The rest serves the eager call only: the rotary angles (vLLM's own
    attention takes those under tensor parallelism), the longest image (a host tensor, or None
    for backends that take none) and each image's patches (host ints, for the plugin's own
    attention modes)."""

    pixels: torch.Tensor  # (patches, channels, patch, patch): uint8 or float, as vLLM sends them
    positions: torch.Tensor  # (patches, hidden)
    cu_seqlens: torch.Tensor  # int32 (images + 1,)
    cos: torch.Tensor  # float32 (patches, head_dim / 2)
    sin: torch.Tensor
    merged: torch.Tensor  # int32 (patches,): Packing.merged
    angles: torch.Tensor | None = None
    max_seqlen: torch.Tensor | None = None
    lengths: tuple[int, ...] = ()


class PackedEncoder:
    """Runs `visual` and `projector` over a whole batch of images at once."""

    def __init__(
        self, visual: SiglipVisionModel, projector: Projector, norm: torch.nn.Module
    ) -> None:
        self.vision = visual.vision_model
        self.projector = projector
        self.merge = visual.vision_model.config.spatial_merge_size
        self.positions = PositionCache(self.vision.embeddings)
        self.rotate = fused_rotary()
        self.mode = attention.mode()  # OCRVL_PLUGIN_VIT_ATTENTION; ValueError for a wrong one
        self.attend = attention.for_mode(self.mode)  # None: vLLM's own MMEncoderAttention
        # vLLM's input norm (build_mm_input_norm): uint8 patches to the model dtype, rescaled
        # and normalised (FusedMMInputNorm, with mm_device_do_normalize), or only cast
        self.norm = norm.to(self.vision.embeddings.patch_embedding.weight.device)

    def __call__(
        self, pixel_values: torch.Tensor | Sequence[torch.Tensor], image_grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """One embedding tensor per image, in order, each (its tokens, text hidden size)."""
        tokens, packing = self.encode(pixel_values, image_grid_thw)
        return torch.split(tokens, packing.tokens)

    def encode(
        self, pixel_values: torch.Tensor | Sequence[torch.Tensor], image_grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, Packing]:
        """Every image's tokens in one tensor, in order, and the packing that says whose."""
        packing = Packing.of(image_grid_thw.tolist(), self.merge)
        return self.run(self.prepare(pixel_values, packing)), packing

    def prepare(
        self, pixel_values: torch.Tensor | Sequence[torch.Tensor], packing: Packing
    ) -> Layers:
        """The call's inputs on the device: the patches in one tensor, the packing's indices
        (one host-to-device copy), each grid's position table, the rotary's angles and cos/sin
        (once per call, not in each of the 27 layers)."""
        if isinstance(pixel_values, torch.Tensor):  # same-sized images arrive stacked
            pixels = pixel_values.flatten(0, 1)
        else:
            pixels = torch.cat(list(pixel_values))
        device = self.vision.embeddings.patch_embedding.weight.device
        cu_seqlens, rows, cols, merged = packing.to_device(device)
        tables = []
        for t, h, w in packing.grids:
            table = self.positions(h, w)
            tables.append(table.repeat(t, 1) if t > 1 else table)
        encoder = self.vision.encoder
        longest = max(max(h, w) for _, h, w in packing.grids)
        angles = encoder.rotary_pos_emb(longest)[torch.stack([rows, cols], dim=-1)].flatten(1)
        lengths = tuple(t * h * w for t, h, w in packing.grids)
        return Layers(pixels, torch.cat(tables), cu_seqlens, angles.cos(), angles.sin(), merged,
                      angles, self.max_seqlen(packing.max_seqlen), lengths)  # fmt: skip

    def max_seqlen(self, longest: int) -> torch.Tensor | None:
        """The longest image's patches for the backends whose kernels take it, None for the
        others; on the host, so the kernels' .item() reads no device memory (no sync a layer)."""
        if self.vision.encoder.attn_backend not in MAX_SEQLEN_BACKENDS:
            return None
        return torch.tensor(longest, dtype=torch.int32)

    def run(self, shared: Layers) -> torch.Tensor:
        """(tokens of every image, text hidden size): the input norm, the patch embedding plus
        the positions, the encoder layers (attention inside each image: cu_seqlens), the
        post-norm and the projector, over the packed sequence."""
        pixels = shared.pixels
        weight = self.vision.embeddings.patch_embedding.weight
        flat = self.norm(pixels.reshape(len(pixels), -1), weight.dtype)  # (patches, 3 x 14 x 14)
        patches: torch.Tensor = self.vision.embeddings.patch_embedding(flat.view(pixels.shape))
        hidden = (patches.flatten(-2).squeeze(-1) + shared.positions).unsqueeze(0)
        for layer in self.vision.encoder.layers:
            hidden = self.layer(cast(SiglipEncoderLayer, layer), hidden, shared)
        normed: torch.Tensor = self.vision.post_layernorm(hidden)
        return self.project(normed, shared.merged)

    def layer(
        self, layer: SiglipEncoderLayer, hidden: torch.Tensor, shared: Layers
    ) -> torch.Tensor:
        """vLLM's SiglipEncoderLayer.forward, with the attention below."""
        residual = hidden
        hidden = layer.layer_norm1(hidden)
        if layer.self_attn.tp_size > 1:  # vLLM's own attention: it gathers q/k/v across ranks
            hidden = layer.self_attn(
                hidden,
                cu_seqlens=shared.cu_seqlens,
                rotary_pos_emb=shared.angles,
                max_seqlen=shared.max_seqlen,
            )
        else:
            hidden = self.attention(layer.self_attn, hidden, shared)
        hidden = residual + hidden
        residual = hidden
        hidden = layer.mlp(layer.layer_norm2(hidden))
        return residual + hidden

    def attention(
        self, attn: SiglipAttention, hidden: torch.Tensor, shared: Layers
    ) -> torch.Tensor:
        """SiglipAttention.forward (one rank) with the rotary applied to the q/k half of the
        packed qkv projection: by vLLM's ApplyRotaryEmb (fp32, out of place), or in place by the
        plugin's kernel (`fused_rotary`, opt-in); cos/sin come computed once per call."""
        length = hidden.shape[1]
        heads = attn.num_attention_heads_per_partition
        qkv, _ = attn.qkv_proj(hidden)
        qkv = qkv.view(1, length, 3, heads, attn.hidden_size_per_attention_head)
        qk = qkv[:, :, :2].flatten(2, 3)  # (1, length, 2 * heads, head_dim), a view
        if self.rotate is not None:
            self.rotate(qk, shared.cos, shared.sin)
            q, k, v = qkv.unbind(2)
        else:
            rotated = attn.apply_rotary_emb(qk, shared.cos, shared.sin).unflatten(2, (2, heads))
            (q, k), v = rotated.unbind(2), qkv[:, :, 2]
        if self.attend is not None:  # OCRVL_PLUGIN_VIT_ATTENTION's choice (attention.py)
            scale = attn.hidden_size_per_attention_head**-0.5
            context = self.attend(q, k, v, shared.lengths, scale)
        else:
            context = attn.attn(
                query=q, key=k, value=v, cu_seqlens=shared.cu_seqlens, max_seqlen=shared.max_seqlen
            )
        output, _ = attn.out_proj(context.flatten(2))
        return output  # type: ignore[no-any-return]

    def project(self, hidden: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
        """The projector (mlp_AR) once over every image: pre-norm, each 2x2 block of patches
        gathered into one row (the order `Packing.merged` gives), then the MLP."""
        projector = self.projector
        hidden = projector.pre_norm(hidden.squeeze(0))
        hidden = hidden.index_select(0, merged).view(-1, projector.hidden_size)
        return projector.linear_2(projector.act(projector.linear_1(hidden)))  # type: ignore[no-any-return]
