"""Text renderings of a memory plan: the `ocrvl profile plan` report and a profile's YAML block."""

from __future__ import annotations

import textwrap

from app.profiles.engines import EnginesPlan
from app.profiles.layout import LAYOUT_MAX_BATCH, layout_bytes
from app.profiles.memory import (
    MAX_NUM_SEQS_CAP,
    MIN_PAGES,
    PROMPT_TEXT_TOKENS,
    RECIPE_MAX_NUM_BATCHED_TOKENS,
    TYPICAL_OUTPUT_TOKENS,
    MemoryPlan,
    cuda_total,
    layout_batch,
)
from app.profiles.shapes import GiB, ModelShape


def _gib(value: int) -> str:
    return f"{value / GiB:6.2f} GiB"


def describe(result: MemoryPlan, shape: ModelShape) -> str:
    """The human-readable breakdown `ocrvl profile plan` prints."""
    limits = result.limits
    lines: list[str] = []
    if result.total_bytes is not None and limits.kv_cache_memory_bytes is None:
        lines += [
            f"GPU memory              {_gib(result.total_bytes)}",
            f"vLLM budget             {_gib(result.budget_bytes)}"
            f"  (gpu-memory-utilization {limits.gpu_memory_utilization})",
            f"  weights               {_gib(result.weights_bytes)}",
            f"  activation peak       {_gib(result.activation_bytes)}  ({result.profiled_images} "
            f"images x {shape.max_visual_tokens_per_image:,} visual tokens, or "
            f"{limits.max_num_batched_tokens:,} LM tokens + sampler)",
            f"  encoder cache         {_gib(result.encoder_cache_bytes)}",
            f"  runtime (non-torch)   {_gib(result.runtime_bytes)}",
            f"  CUDA graphs           {_gib(result.graph_bytes)}",
            f"layout service          {_gib(result.layout_bytes)}  (--max-batch "
            f"{result.layout_batch}, outside the budget, on the same GPU: app/profiles/layout.py)",
        ]
    lines += [
        f"KV cache                {_gib(result.kv_bytes)}  = {result.kv_tokens:,} tokens "
        f"({result.kv_blocks:,} blocks of {limits.block_size})",
        f"  per token             {result.kv_bytes_per_token:,} B = {shape.num_layers} layers x "
        f"{shape.num_kv_heads} KV heads x {shape.head_dim} x 2 (K, V) x {limits.dtype_bytes} B",
        f"typical page            {result.page_tokens:,} tokens "
        f"({shape.max_visual_tokens_per_image:,} visual + {PROMPT_TEXT_TOKENS} prompt + "
        f"{TYPICAL_OUTPUT_TOKENS:,} output)",
        f"pages in the KV cache   {result.concurrent_pages:,}",
        f"max-num-seqs            {limits.max_num_seqs}"
        f"  -> {min(result.concurrent_pages, limits.max_num_seqs)} pages at once",
    ]
    lines += [f"error: {message}" for message in result.errors]
    lines += [f"warning: {message}" for message in result.warnings]
    return "\n".join(lines)


def layout_paragraph(total_bytes: int) -> str:
    """The `# Layout service: --max-batch N` paragraph of a GPU profile's header: the batch
    compose and `make serve` give the layout service on that card, and why."""
    batch = layout_batch(total_bytes)
    share = layout_bytes(batch) / GiB
    card = cuda_total(total_bytes) / GiB
    if batch == LAYOUT_MAX_BATCH:
        text = (
            f"Layout service: --max-batch {batch}, its default: its share, {share:.2f} GiB, is "
            f"within a third of the card's {card:.2f} GiB (app/profiles/layout.py)."
        )
    else:
        text = (
            f"Layout service: --max-batch {batch}, the largest batch whose share ({share:.2f} "
            f"GiB) is within a third of the card's {card:.2f} GiB; its default of "
            f"{LAYOUT_MAX_BATCH} would take {layout_bytes(LAYOUT_MAX_BATCH) / GiB:.2f} GiB "
            "(app/profiles/layout.py)."
        )
    text += " Compose and `make serve` start it so; LAYOUT_MAX_BATCH changes it."
    return textwrap.fill(text, width=99, initial_indent="# ", subsequent_indent="# ") + "\n"


def yaml_block(result: MemoryPlan, shape: ModelShape) -> str:
    """The memory-model part of a profile, with a comment on each number."""
    limits = result.limits
    total = result.total_bytes or 0
    if limits.max_num_seqs >= MAX_NUM_SEQS_CAP:
        seqs = (
            f"# The KV cache holds {result.concurrent_pages:,} pages; {MAX_NUM_SEQS_CAP} at once "
            "keep the vision encoder busy, more only wait for it."
        )
    else:
        seqs = (
            f"# The KV cache holds {result.concurrent_pages:,} pages; rounded down to a multiple "
            "of 8,\n# every admitted page fits and none is preempted."
        )
    batched = (
        f"# The recipe's {RECIPE_MAX_NUM_BATCHED_TOKENS:,}: {result.profiled_images} full "
        "pages prefill per step; sets the encoder's profiling batch."
    )
    if limits.max_num_batched_tokens < RECIPE_MAX_NUM_BATCHED_TOKENS:
        batched = (
            f"# Below the recipe's {RECIPE_MAX_NUM_BATCHED_TOKENS:,}, whose encoder profiling "
            f"would leave the KV cache fewer than {MIN_PAGES}\n# pages: "
            f"{result.profiled_images} full pages prefill per step; sets the encoder's "
            "profiling batch."
        )
    return "\n".join(
        [
            f"# The largest share of {cuda_total(total) / GiB:.2f} GiB (CUDA's total) that leaves "
            "the reserve and the",
            f"# layout service's {result.layout_bytes / GiB:.2f} GiB (--max-batch "
            f"{result.layout_batch}) outside vLLM's budget ({result.budget_bytes / GiB:.2f} GiB):",
            f"#   weights {result.weights_bytes / GiB:.2f}, activation peak "
            f"{result.activation_bytes / GiB:.2f}, encoder cache "
            f"{result.encoder_cache_bytes / GiB:.2f}, runtime {result.runtime_bytes / GiB:.2f}, "
            f"CUDA graphs {result.graph_bytes / GiB:.2f} GiB;",
            f"#   KV cache {result.kv_bytes / GiB:.2f} GiB = {result.kv_tokens:,} tokens = "
            f"{result.concurrent_pages:,} pages of {result.page_tokens:,} tokens.",
            f"gpu-memory-utilization: {limits.gpu_memory_utilization}",
            "",
            f"# A page's prompt ({shape.max_visual_tokens_per_image + PROMPT_TEXT_TOKENS:,}) plus "
            "PaddleOCR's max_completion_tokens (4,096),",
            "# rounded up to a power of two.",
            f"max-model-len: {limits.max_model_len}",
            "",
            seqs,
            f"max-num-seqs: {limits.max_num_seqs}",
            "",
            batched,
            f"max-num-batched-tokens: {limits.max_num_batched_tokens}",
        ]
    )


def describe_engines(result: EnginesPlan, shape: ModelShape) -> str:
    """`ocrvl profile plan --engines-per-gpu N`: the card split N ways, then one engine."""
    share = result.limits.gpu_memory_utilization
    total = result.total_bytes
    lines = [
        f"GPU memory              {_gib(total)}  (CUDA sees {_gib(cuda_total(total)).strip()})",
        f"engines per GPU         {result.engines} (under MPS): each gpu-memory-utilization "
        f"{share} (checked free at start)",
        f"each engine at load     {_gib(result.footprint_bytes)}  = KV cache "
        f"{result.engine.kv_bytes / GiB:.2f} + measured overhead {result.overhead_bytes / GiB:.2f}"
        " GiB (weights, CUDA graphs, context, activations: app/profiles/engines.py)",
        f"MPS server              {_gib(result.mps_bytes)}",
        f"layout service          {_gib(result.layout_bytes)}  (--max-batch "
        f"{layout_batch(total)}: app/profiles/layout.py)",
        f"left free at load       {_gib(result.left_bytes)}  ({result.engines} x "
        f"{result.margin_bytes / GiB:.2f} GiB margin, and rounding)",
        f"KV cache, all engines   {_gib(result.engines * result.engine.kv_bytes)}  = "
        f"{result.engines * result.engine.concurrent_pages:,} pages",
        "",
        "each engine:",
        describe(result.engine, shape),
    ]
    if result.limits.kv_cache_memory_bytes:
        lines.append(
            f"kv-cache-memory-bytes   {result.limits.kv_cache_memory_bytes}  (fixed, so the "
            "engines can start together)"
        )
    lines += [f"error: {e}" for e in result.errors if e not in result.engine.errors]
    return "\n".join(lines)


def engines_block(result: EnginesPlan) -> str:
    """The flags each of N engines passes after `--config <profile>` (compose/mps/*.env)."""
    total = result.total_bytes / GiB
    return "\n".join(
        [
            f"# Each of {result.engines} engines under MPS on {total:.2f} GiB: "
            f"KV cache {result.engine.kv_bytes / GiB:.2f} GiB = {result.engine.kv_tokens:,} "
            f"tokens = {result.engine.concurrent_pages:,} pages;",
            f"# {result.overhead_bytes / GiB:.2f} GiB beside it as measured at load, "
            f"{result.left_bytes / GiB:.2f} GiB left free (margins) beside the MPS server and "
            f"the layout service's {result.layout_bytes / GiB:.2f} GiB.",
            *(f"{key}: {value}" for key, value in result.flags.items()),
        ]
    )


def engines_env(result: EnginesPlan, profile: str) -> str:
    """compose/mps/<profile>.env: each engine's flags, as the MPS layout's engines read them."""
    command = f"ocrvl profile plan --profile {profile} --engines-per-gpu {result.engines} --env"
    lines = [
        f"# {profile}: {result.engines} engines per GPU under MPS (compose/layouts/"
        "gpus-*-engines-2.yml);",
        "# each passes these after --config. Written by",
        f"#   {command}",
        "# tests/deploy/test_compose_layouts.py keeps the file equal to the memory model.",
        *(f"ENGINE_{key.upper().replace('-', '_')}={value}" for key, value in result.flags.items()),
    ]
    return "".join(f"{line}\n" for line in lines)
