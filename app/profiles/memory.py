"""The memory model: how vLLM splits a GPU between weights, activations and the KV cache.

It follows vLLM's own accounting (`gpu_worker.determine_available_memory`, `kv_cache_utils`):

    budget   = ceil(gpu-memory-utilization x total memory)
    KV cache = budget - weights - activation peak - encoder cache - runtime - CUDA graphs
    blocks   = KV cache // (block-size x KV bytes per token); tokens as vLLM logs them

The total is CUDA's, not nvidia-smi's: vLLM multiplies the utilization by what
`cudaMemGetInfo` reports, which is nvidia-smi's `memory.total` less what the driver keeps
(`DRIVER_RESERVED_BYTES`, measured on an H200). On a GPU the budget also leaves room for the
layout service beside vLLM (`layout.py`): its CUDA context and what PyTorch's allocator
reserves for its weights and largest batch stay outside every profile's share of the card. That
batch is the card's (`layout_batch`): 8, or less on a card where 8 would take over a third.

The activation peak is the larger of vLLM's two profiling passes: the vision encoder over one
encoder budget of images (max(max-num-batched-tokens, one image) visual tokens) and the language
model over max-num-batched-tokens tokens plus the sampler over max-num-seqs rows. Every number
in `vllm_configs/*.yaml` comes out of `derive` and `plan` here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.profiles.gpus import Card
from app.profiles.layout import layout_batch_for, layout_bytes
from app.profiles.shapes import GiB, ModelShape

MiB = 1024**2

DRIVER_RESERVED_BYTES = 143_771 * MiB - 150_109_880_320
"""nvidia-smi's memory.total less the total CUDA reports (615 MiB), measured on the H200 of the
ninth pass: 143,771 MiB against torch's "total capacity of 139.80 GiB" (150,109,880,320 B in
the caching allocator's OOM line) in layout-8300.cut.log of
bench/results/gpu-h200-2026-12-02-pass9-raw/pass-raw.tar.gz. Assumed the same on every card."""

CONTEXT_BYTES = GiB // 2
"""CUDA context and loaded kernels: used before vLLM measures free memory, outside the budget."""
RESERVE_BYTES = 1 * GiB
"""Left outside the budget on a datacenter card: the context plus allocations after the KV cache."""
GEFORCE_RESERVE_BYTES = 3 * GiB // 2
"""A GeForce card may also drive a display."""
UTILIZATION_CAP = 0.95
RUNTIME_BYTES = GiB // 4
"""Non-torch memory vLLM counts inside the budget (cuBLAS workspaces, allocator slack)."""
CUDA_GRAPH_BYTES = round(0.27 * GiB)
"""CUDA graphs of the 0.3 B decoder, as vLLM 0.23 logged them on an H200 (max-num-seqs 256:
51 piecewise sizes up to 512, 35 full up to 256): it takes its estimate (0.23 GiB) out of the
budget and the pool took 0.27 GiB (bench/results/gpu-h200-2026-12-01.md). The larger figure, so the
model stays on the safe side; it was 0.5 GiB before it was measured."""

MORE_GRAPHS_BYTES = round(1.77 * GiB)
"""What a profile's `compilation-config` adds when it records more graphs than vLLM's default:
the vision encoder's (`cudagraph_mm_encoder`, 16 token budgets to 8,192) and the language model's
capture sizes past 512 (to 2,048). Measured on one H100 (the twenty-seventh pass,
bench/results/gpu-h100-2026-12-07-graphs-whole-raw.tar.gz, vLLM 0.32.0, max-num-seqs 256):
"Graph capturing finished ..., took 2.04 GiB" with them against 0.27 GiB without (vllm-8119.log,
vllm-8118.log), the two captures one after the other. vLLM's figure is the device's free memory
before and after the capture, so engines capturing at once count each other's: the
twenty-sixth pass's overlapping captures read 1.56 against 0.65 (0.91 more, this constant's
value until then). One engine alone (the twenty-third pass) took 1.78 GiB with the encoder's
graphs (14 budgets) against 0.15 without. vLLM takes its own estimate of both out of the budget
(`profile_cudagraph_memory`); the model counts the difference, since the default's figure above
stays as measured before."""
MORE_GRAPHS_FROM = 512
"""vLLM 0.32's own ceiling on capture sizes (min(2 x max-num-seqs, 512)): a larger one is more."""

VISION_BASE_MIB = 18.0
VISION_MIB_PER_TOKEN = 0.154
VISION_REFERENCE_INTERMEDIATE = 4304
"""Least-squares fit of the measured encoder peaks (MEASURED.md: 59 MiB @ 144 visual tokens ...
579 MiB @ 3,600), scaled by the vision MLP width for other checkpoints."""
SAMPLER_COPIES = 3
"""fp32 logits, probabilities and one sampler temporary per row of the vocabulary."""

PROMPT_TEXT_TOKENS = 12
"""Chat template and `OCR:` around the image (MEASURED.md: 1,280 visual + 12 text tokens)."""
TYPICAL_OUTPUT_TOKENS = 1024
"""A dense A4 page of text: roughly 3,000 characters."""
CLIENT_MAX_COMPLETION_TOKENS = 4096
"""PaddleOCR's client asks for this on every page (CLIENTS.md)."""
RECIPE_MAX_NUM_BATCHED_TOKENS = 16384
"""vLLM's PaddleOCR-VL recipe starting point."""
MAX_NUM_SEQS_CAP = 256
"""vLLM's long-standing default; beyond it the vision encoder, not the KV cache, bounds pages/s."""
MIN_PAGES = 8
"""The fewest pages a profile admits at once (max-num-seqs), and so the fewest its KV cache must
hold: below them `derive` lowers max-num-batched-tokens rather than plan a cache that holds none."""
DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "auto": 2}


def more_graphs(value: object) -> bool:
    """Whether a `compilation-config` (the JSON string a profile gives) records the encoder's
    graphs or language-model sizes past vLLM's default ceiling; ValueError if it is no JSON (vLLM's
    parser names what else is wrong with it)."""
    config = json.loads(str(value)) if value is not None else {}
    if not isinstance(config, dict):
        return False
    sizes = config.get("cudagraph_capture_sizes")
    past = isinstance(sizes, list) and any(
        isinstance(size, int) and size > MORE_GRAPHS_FROM for size in sizes
    )
    return config.get("cudagraph_mm_encoder") is True or past


def _count(value: object) -> int:
    """An integer flag as vLLM reads it: `16384`, `16k` (x1000) or `16K` (x1024)."""
    text = str(value).strip()
    multiplier = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in multiplier:
        return int(float(text[:-1]) * multiplier[text[-1]])
    return int(text)


@dataclass(frozen=True)
class EngineLimits:
    """The profile settings the memory model reads."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    dtype_bytes: int = 2
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    block_size: int = 16
    enforce_eager: bool = False
    more_graphs: bool = False

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], device: str = "cuda") -> EngineLimits:
        """Read the limits from a profile's flags (missing ones take vLLM's defaults)."""
        utilization = flags.get("gpu-memory-utilization")
        kv_bytes = flags.get("kv-cache-memory-bytes")
        return cls(
            max_model_len=_count(flags.get("max-model-len", 8192)),
            max_num_seqs=_count(flags.get("max-num-seqs", MAX_NUM_SEQS_CAP)),
            max_num_batched_tokens=_count(flags.get("max-num-batched-tokens", 8192)),
            dtype_bytes=DTYPE_BYTES.get(str(flags.get("dtype", "auto")), 2),
            gpu_memory_utilization=None if utilization is None else float(utilization),
            kv_cache_memory_bytes=None if kv_bytes is None else _count(kv_bytes),
            block_size=int(flags.get("block-size", DEFAULT_BLOCK_SIZE[device])),
            enforce_eager=flags.get("enforce-eager") is True,
            more_graphs=more_graphs(flags.get("compilation-config")),
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Where the memory goes, what the KV cache holds, and whether the config can start."""

    limits: EngineLimits
    total_bytes: int | None
    budget_bytes: int
    weights_bytes: int
    activation_bytes: int
    encoder_cache_bytes: int
    runtime_bytes: int
    graph_bytes: int
    profiled_images: int
    layout_batch: int
    kv_bytes: int
    kv_bytes_per_token: int
    kv_blocks: int
    kv_tokens: int
    page_tokens: int
    concurrent_pages: int
    errors: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def layout_bytes(self) -> int:
        """The layout service's share kept outside the budget: 0 without one (CPU, fixed KV)."""
        return 0 if self.layout_batch == 0 else layout_bytes(self.layout_batch)


def kv_cache_tokens(
    kv_bytes: int, bytes_per_token: int, block_size: int, max_model_len: int
) -> tuple[int, int]:
    """(blocks, tokens) exactly as vLLM logs `KV cache size: N tokens`."""
    blocks = max(kv_bytes, 0) // (block_size * bytes_per_token)
    per_request = math.ceil(max_model_len / block_size)
    return blocks, int(blocks / per_request * max_model_len)


def page_tokens(shape: ModelShape) -> int:
    """Tokens of one typical page: the largest image, the prompt text and a dense page's output."""
    return shape.max_visual_tokens_per_image + PROMPT_TEXT_TOKENS + TYPICAL_OUTPUT_TOKENS


def profiled_images(shape: ModelShape, limits: EngineLimits) -> int:
    """Images of the largest size vLLM's encoder profiling pass runs at once."""
    per_image = shape.max_visual_tokens_per_image
    budget = max(limits.max_num_batched_tokens, per_image)
    return max(1, min(budget // per_image, limits.max_num_seqs))


def activation_bytes(shape: ModelShape, limits: EngineLimits) -> int:
    """Peak of vLLM's profiling passes: vision encoder vs language model plus sampler."""
    visual = profiled_images(shape, limits) * shape.max_visual_tokens_per_image
    width = shape.vision_intermediate_size / VISION_REFERENCE_INTERMEDIATE
    vision = (VISION_BASE_MIB + VISION_MIB_PER_TOKEN * visual) * width * MiB
    q_dim = shape.num_attention_heads * shape.head_dim
    kv_dim = shape.num_kv_heads * shape.head_dim
    per_token = 4 * shape.hidden_size + q_dim + 2 * kv_dim + 3 * shape.intermediate_size
    language = limits.max_num_batched_tokens * per_token * limits.dtype_bytes
    sampler = limits.max_num_seqs * shape.vocab_size * 4 * SAMPLER_COPIES
    return int(max(vision, language + sampler))


def cuda_total(total_bytes: int) -> int:
    """The total CUDA (and so vLLM's gpu-memory-utilization) sees on a card of nvidia-smi's size."""
    return total_bytes - DRIVER_RESERVED_BYTES


def layout_batch(total_bytes: int) -> int:
    """The layout service's `--max-batch` on a card of nvidia-smi's size (`layout_batch_for`)."""
    return layout_batch_for(cuda_total(total_bytes))


def layout_share(total_bytes: int) -> int:
    """The layout service's share of a card of nvidia-smi's size, at the card's batch."""
    return layout_bytes(layout_batch(total_bytes))


def _budget(limits: EngineLimits, card_total: int | None) -> tuple[int, list[str]]:
    if limits.kv_cache_memory_bytes is not None or card_total is None:
        return 0, []
    total = cuda_total(card_total)
    utilization = limits.gpu_memory_utilization or 0.92
    budget = math.ceil(total * utilization)
    if budget > total - CONTEXT_BYTES:
        return budget, [
            f"cannot start: gpu-memory-utilization {utilization} asks for {budget / GiB:.2f} GiB "
            f"but only about {(total - CONTEXT_BYTES) / GiB:.2f} GiB is free once the CUDA "
            "context is up; lower it"
        ]
    batch = layout_batch(card_total)
    layout = layout_bytes(batch)
    if budget > total - CONTEXT_BYTES - layout:
        return budget, [
            f"no room for the layout service: gpu-memory-utilization {utilization} leaves "
            f"{(total - CONTEXT_BYTES - budget) / GiB:.2f} GiB beside vLLM's CUDA context, and "
            f"the layout service on the same GPU needs {layout / GiB:.2f} GiB at --max-batch "
            f"{batch} (app/profiles/layout.py); lower it"
        ]
    return budget, []


def plan(shape: ModelShape, limits: EngineLimits, total_bytes: int | None = None) -> MemoryPlan:
    """Run the model for one card (total_bytes) or an explicit KV size (CPU)."""
    budget, errors = _budget(limits, total_bytes)
    explicit = limits.kv_cache_memory_bytes
    images = profiled_images(shape, limits)
    weights = activation = cache = runtime = graphs = 0
    if explicit is None:
        weights = shape.weights_bytes
        activation = activation_bytes(shape, limits)
        cache = images * shape.max_visual_tokens_per_image * shape.hidden_size * limits.dtype_bytes
        runtime = RUNTIME_BYTES
        graphs = 0 if limits.enforce_eager else graph_bytes(limits)
        kv = budget - weights - activation - cache - runtime - graphs
    else:
        kv = explicit
    per_token = shape.kv_bytes_per_token(limits.dtype_bytes)
    blocks, tokens = kv_cache_tokens(kv, per_token, limits.block_size, limits.max_model_len)
    page = page_tokens(shape)
    pages = blocks // math.ceil(page / limits.block_size)
    warnings: list[str] = []
    if kv <= 0:
        errors.append(
            f"cannot start: negative KV memory ({kv / GiB:.2f} GiB): weights, activations and "
            "graphs exceed the budget (vllm#31372); raise gpu-memory-utilization or lower "
            "max-num-batched-tokens"
        )
    elif tokens < limits.max_model_len:
        errors.append(
            f"cannot start: the KV cache holds {tokens:,} tokens, less than one request of "
            f"max-model-len {limits.max_model_len:,}; lower max-model-len or give it more memory"
        )
    if 0 < pages < limits.max_num_seqs:
        warnings.append(
            f"will queue: the KV cache holds {pages} typical pages ({page:,} tokens each) but "
            f"max-num-seqs is {limits.max_num_seqs}; the rest wait or get preempted"
        )
    wanted = shape.max_visual_tokens_per_image + PROMPT_TEXT_TOKENS + CLIENT_MAX_COMPLETION_TOKENS
    if limits.max_model_len < CLIENT_MAX_COMPLETION_TOKENS:
        warnings.append(
            f"max-model-len {limits.max_model_len:,} is below PaddleOCR's max_completion_tokens "
            f"{CLIENT_MAX_COMPLETION_TOKENS:,}: vLLM answers its pages with a 400"
        )
    elif limits.max_model_len < wanted:
        warnings.append(
            f"max-model-len {limits.max_model_len:,} < {wanted:,} (a page plus PaddleOCR's "
            f"max_completion_tokens): a page that long ends with finish_reason `length`"
        )
    batch = 0 if explicit is not None or total_bytes is None else layout_batch(total_bytes)
    return MemoryPlan(
        limits=limits,
        total_bytes=total_bytes,
        budget_bytes=budget if explicit is None else explicit,
        weights_bytes=weights,
        activation_bytes=activation,
        encoder_cache_bytes=cache,
        runtime_bytes=runtime,
        graph_bytes=graphs,
        layout_batch=batch,
        profiled_images=images,
        kv_bytes=kv,
        kv_bytes_per_token=per_token,
        kv_blocks=blocks,
        kv_tokens=tokens,
        page_tokens=page,
        concurrent_pages=pages,
        errors=tuple(errors),
        warnings=tuple(warnings),
    )


def graph_bytes(limits: EngineLimits) -> int:
    """The CUDA graphs' memory: vLLM's default set, and what a profile records beyond it."""
    return CUDA_GRAPH_BYTES + (MORE_GRAPHS_BYTES if limits.more_graphs else 0)


def utilization_for(total_bytes: int, geforce: bool = False) -> float:
    """The largest utilization that leaves the reserve and the layout service's share outside
    vLLM's budget, capped at 0.95."""
    reserve = (GEFORCE_RESERVE_BYTES if geforce else RESERVE_BYTES) + layout_share(total_bytes)
    total = cuda_total(total_bytes)
    return min(UTILIZATION_CAP, math.floor((total - reserve) / total * 100) / 100)


def max_model_len_for(shape: ModelShape) -> int:
    """The smallest power of two that holds a page's prompt plus the client's output budget."""
    wanted = shape.max_visual_tokens_per_image + PROMPT_TEXT_TOKENS + CLIENT_MAX_COMPLETION_TOKENS
    return 1 << (wanted - 1).bit_length()


def derive(
    total_bytes: int,
    shape: ModelShape,
    *,
    geforce: bool = False,
    utilization: float | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> EngineLimits:
    """The profile numbers for a card: fill the budget, then as many pages as the KV cache holds.

    max-num-batched-tokens is the recipe's 16,384 unless given; where neither it nor the
    utilization is given and the activation peak of its encoder profiling leaves the KV cache
    fewer than `MIN_PAGES` pages, it is halved until the cache holds them, down to one image (no
    catalogue card needs it since a small card's layout service batches fewer pages; the RTX 3060
    did beside a batch of 8).
    """

    def fitted(tokens: int) -> EngineLimits:
        limits = EngineLimits(
            max_model_len=max_model_len or max_model_len_for(shape),
            max_num_seqs=max_num_seqs or MAX_NUM_SEQS_CAP,
            max_num_batched_tokens=tokens,
            dtype_bytes=2,
            gpu_memory_utilization=utilization or utilization_for(total_bytes, geforce),
            block_size=DEFAULT_BLOCK_SIZE["cuda"],
        )
        if max_num_seqs is None:
            pages = plan(shape, limits, total_bytes).concurrent_pages
            limits = replace(
                limits, max_num_seqs=max(MIN_PAGES, min(MAX_NUM_SEQS_CAP, pages) // 8 * 8)
            )
        return limits

    tokens = max_num_batched_tokens or RECIPE_MAX_NUM_BATCHED_TOKENS
    limits = fitted(tokens)
    while (
        max_num_batched_tokens is None
        and utilization is None
        and tokens // 2 >= shape.max_visual_tokens_per_image
        and plan(shape, limits, total_bytes).concurrent_pages < MIN_PAGES
    ):
        tokens //= 2
        limits = fitted(tokens)
    return limits


def derive_for_card(card: Card, shape: ModelShape) -> EngineLimits:
    """`derive` for a catalogue card."""
    return derive(card.memory_bytes, shape, geforce=card.geforce)
