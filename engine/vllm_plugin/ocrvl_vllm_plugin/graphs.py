"""The packed encoder under CUDA graphs: what vLLM 0.32's `SupportsEncoderCudaGraph` asks of a
model, for `PackedPaddleOCRVLForConditionalGeneration` (model.py) to hand on.

Opt-in, off unless the engine is started with
`--compilation-config '{"cudagraph_mm_encoder": true}'`: vLLM's EncoderCudaGraphManager then
records `PackedEncoder.run` once per token budget (64, 128, ... up to the step's token budget,
in output tokens) over buffers of the six tensors `run` reads (`BUFFERS`), and before each replay
copies a step's images into them (`replay`), zero-padded. The padded patches belong to no image:
`cu_seqlens` repeats its last offset over the unused images (`pad_offsets`), so attention never
reads them, and vLLM takes each image's tokens from the front of the output. A batch larger than
the largest budget runs eagerly (`PackedEncoder.run` without a graph). Every replay runs the
same kernels as the eager call on the same values; the graph removes the host's launch of them
(the eager encoder took ~30 ms a call for one block on an H200, its GPU work a tenth of that).

What a graph cannot hold, and so refuses at start (`check`): the plugin's own attention modes
(`OCRVL_PLUGIN_VIT_ATTENTION` other than `vllm`: they split images by host ints), a ViT
attention backend without a varlen kernel (TORCH_SDPA: the same), and tensor parallelism
(vLLM's own attention gathers across ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from vllm.v1.worker.encoder_cudagraph_defs import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)

from ocrvl_vllm_plugin.encoder import MAX_SEQLEN_BACKENDS, Layers, PackedEncoder
from ocrvl_vllm_plugin.packing import Packing

# What `PackedEncoder.run` reads from `Layers`, each a buffer the graph records
BUFFERS = ("pixels", "positions", "cu_seqlens", "cos", "sin", "merged")

# The ViT attention backends a graph can replay: varlen kernels reading cu_seqlens on the device
# (vLLM's TORCH_SDPA wrapper splits the sequence by cu_seqlens.tolist(), a host read per layer)
REPLAYABLE = frozenset(MAX_SEQLEN_BACKENDS)

# The smallest budget, in output tokens: a 224 x 224 image (16 x 16 patches, 8 x 8 tokens), as
# vLLM's ERNIE-4.5-VL takes it; layout blocks are larger (PaddleX's min_pixels: 144 tokens).
MIN_BUDGET = 64


def check(encoder: PackedEncoder) -> None:
    """ValueError, said at the engine's start, for a set-up a graph cannot record."""
    if encoder.mode != "vllm":
        raise ValueError(
            f"encoder CUDA graphs (cudagraph_mm_encoder) need OCRVL_PLUGIN_VIT_ATTENTION=vllm: "
            f"{encoder.mode!r} splits images by host ints, which a graph cannot replay"
        )
    backend = encoder.vision.encoder.attn_backend
    if backend not in REPLAYABLE:
        names = ", ".join(sorted(b.name for b in REPLAYABLE))
        raise ValueError(
            f"encoder CUDA graphs (cudagraph_mm_encoder) need a varlen ViT attention backend "
            f"({names}; --mm-encoder-attn-backend): {backend.name} reads its offsets on the host"
        )
    if any(layer.self_attn.tp_size > 1 for layer in encoder.vision.encoder.layers):
        raise ValueError("encoder CUDA graphs (cudagraph_mm_encoder) need tensor parallel 1")


def config(text_hidden: int) -> EncoderCudaGraphConfig:
    """Images only; the buffers; cu_seqlens padded with its last offset."""
    return EncoderCudaGraphConfig(
        modalities=["image"],
        buffer_keys=list(BUFFERS),
        padding_logics={"cu_seqlens": pad_offsets},
        out_hidden_size=text_hidden,
    )


def pad_offsets(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`src`'s offsets, then its last over every image the batch does not have: those images
    are empty, and the padded patches after the last offset are in none."""
    dst[: len(src)].copy_(src)
    dst[len(src) :] = src[-1]


def budget_range(vllm_config: Any) -> tuple[int, int]:
    """(MIN_BUDGET, the most tokens a step can encode) in output tokens."""
    scheduler, model = vllm_config.scheduler_config, vllm_config.model_config
    return MIN_BUDGET, min(scheduler.max_num_batched_tokens, model.max_model_len)


def item_specs(mm_kwargs: dict[str, Any], merge: int) -> list[EncoderItemSpec]:
    """Each image's patches in, tokens out (vLLM keeps image_grid_thw on the host)."""
    return [
        EncoderItemSpec(input_size=t * h * w, output_tokens=t * h * w // merge**2)
        for t, h, w in mm_kwargs["image_grid_thw"].tolist()
    ]


def select(mm_kwargs: dict[str, Any], indices: Sequence[int]) -> dict[str, Any]:
    """The images at `indices`, in that order, as vLLM hands a batch (stacked or a list)."""
    pixels = mm_kwargs["pixel_values"]
    chosen = list(indices)
    pixels = pixels[chosen] if isinstance(pixels, torch.Tensor) else [pixels[i] for i in chosen]
    return {"pixel_values": pixels, "image_grid_thw": mm_kwargs["image_grid_thw"][chosen]}


def eager(encoder: PackedEncoder, mm_kwargs: dict[str, Any]) -> torch.Tensor:
    """The batch without a graph: every image's tokens in one tensor, in order."""
    return encoder.encode(mm_kwargs["pixel_values"], mm_kwargs["image_grid_thw"])[0]


def capture(
    encoder: PackedEncoder, token_budget: int, images: int, device: torch.device
) -> EncoderCudaGraphCaptureInputs:
    """Buffers for `images` images of up to `token_budget` tokens together: each image 1 x 2 x
    2k patches (k tokens), the budget over the images rounded up. Zeros but the offsets and the
    gather order, which are those of these images; the values of a replay are copied in."""
    merge, embeddings = encoder.merge, encoder.vision.embeddings
    per_image = -(-token_budget // images)
    packing = Packing.of([(1, merge, per_image * merge)] * images, merge)
    conv = embeddings.patch_embedding
    weight = conv.weight
    channels, (size, _) = conv.in_channels, conv.kernel_size
    pixel_dtype = encoder.norm.input_dtype or weight.dtype  # uint8 when normalised on the device
    config = encoder.vision.config
    half = config.hidden_size // config.num_attention_heads // 2
    patches = packing.patches
    values = {
        "pixels": torch.zeros(patches, channels, size, size, dtype=pixel_dtype, device=device),
        "positions": torch.zeros(patches, weight.shape[0], dtype=weight.dtype, device=device),
        "cu_seqlens": torch.from_numpy(packing.cu_seqlens).to(device),
        "cos": torch.zeros(patches, half, dtype=torch.float32, device=device),
        "sin": torch.zeros(patches, half, dtype=torch.float32, device=device),
        "merged": torch.from_numpy(packing.merged).to(device),
    }
    return EncoderCudaGraphCaptureInputs(values=values)


def replay(encoder: PackedEncoder, mm_kwargs: dict[str, Any]) -> EncoderCudaGraphReplayBuffers:
    """A batch's values for the buffers (the manager zero-pads them into the graph's)."""
    packing = Packing.of(mm_kwargs["image_grid_thw"].tolist(), encoder.merge)
    layers = encoder.prepare(mm_kwargs["pixel_values"], packing)
    return EncoderCudaGraphReplayBuffers(values={key: getattr(layers, key) for key in BUFFERS})


def forward(encoder: PackedEncoder, values: dict[str, torch.Tensor]) -> torch.Tensor:
    """`PackedEncoder.run` over the buffers, as the graph records it: the longest image taken as
    all of them (the varlen kernels size their grid by it; a replay's are shorter)."""
    max_seqlen = encoder.max_seqlen(len(values["pixels"]))
    layers = Layers(**{key: values[key] for key in BUFFERS}, max_seqlen=max_seqlen)
    return encoder.run(layers)
