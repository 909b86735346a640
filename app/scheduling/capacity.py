"""Pages a backend serves at once: the operator's figure, else what its engine tells."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.engines import EngineLoad
from app.profiles.memory import MAX_NUM_SEQS_CAP, PROMPT_TEXT_TOKENS, TYPICAL_OUTPUT_TOKENS

PAGE_VISUAL_TOKENS = 1280  # PaddleOCR-VL's largest image, as the memory model sizes a page
PAGE_TOKENS = PAGE_VISUAL_TOKENS + PROMPT_TEXT_TOKENS + TYPICAL_OUTPUT_TOKENS
PAGE_UNITS = PAGE_VISUAL_TOKENS
"""A page's work in admission units (visual tokens): a layout block weighs its own tokens."""

DEFAULT_CAPACITY = MAX_NUM_SEQS_CAP
"""Before an engine has said anything: the max-num-seqs every profile stays within."""


@dataclass(frozen=True, slots=True)
class Work:
    """What a request costs a backend: its work in units (a page: PAGE_UNITS) and the
    sequences it makes the engine decode at once (`n`)."""

    units: int = PAGE_UNITS
    seqs: int = 1


PAGE = Work()


def kv_pages(load: EngineLoad) -> int | None:
    """Typical pages the engine's KV cache holds (vllm:cache_config_info), if it says."""
    if not load.num_gpu_blocks or not load.block_size:
        return None
    return max(load.num_gpu_blocks // math.ceil(PAGE_TOKENS / load.block_size), 1)


def learnt(load: EngineLoad | None) -> int:
    """The engine's own limit: the fewer of the pages its KV cache holds and its max-num-seqs
    where exposed (vLLM 0.32 does not: then the 256 every profile stays within)."""
    limits = [DEFAULT_CAPACITY]
    if load is not None:
        limits += [v for v in (kv_pages(load), load.max_num_seqs) if v]
    return min(limits)
