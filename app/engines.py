"""What a vLLM engine says of itself on `/metrics`: its load and its KV cache."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

# vLLM's series, one per engine (data-parallel ranks and API servers add `engine` labels).
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(\{.*\})? (\S+)$", re.MULTILINE)
_LABEL = re.compile(r'([a-zA-Z_]+)="([^"]*)"')
STALE_AFTER = 3.0  # seconds: an older reading no longer steers routing


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One scrape of an engine's `/metrics`."""

    running: int
    waiting: int
    kv_usage: float  # 0..1, the fullest engine's
    num_gpu_blocks: int | None  # from vllm:cache_config_info
    block_size: int | None
    max_num_seqs: int | None  # exposed by some vLLM versions only
    scraped_at: float

    def fresh(self, now: float | None = None) -> bool:
        """Whether this reading is recent enough to route by."""
        return (now if now is not None else time.monotonic()) - self.scraped_at < STALE_AFTER


def parse_metrics(text: str, now: float | None = None) -> EngineLoad | None:
    """The engine's load from its Prometheus text; None when it has none of vLLM's series."""
    running = waiting = 0.0
    kv_usage = 0.0
    blocks = block_size = max_seqs = None
    seen = False
    for name, labels, raw in _SAMPLE.findall(text):
        value = _number(raw)
        if value is None and name != "vllm:cache_config_info":
            continue
        if name == "vllm:num_requests_running":
            running, seen = running + (value or 0.0), True
        elif name == "vllm:num_requests_waiting":
            waiting, seen = waiting + (value or 0.0), True
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            kv_usage = max(kv_usage, value or 0.0)
        elif name == "vllm:cache_config_info":
            info = dict(_LABEL.findall(labels))
            blocks = _int(info.get("num_gpu_blocks")) or blocks
            block_size = _int(info.get("block_size")) or block_size
            max_seqs = _int(info.get("max_num_seqs")) or max_seqs
    if not seen:
        return None
    return EngineLoad(
        running=int(running),
        waiting=int(waiting),
        kv_usage=kv_usage,
        num_gpu_blocks=blocks,
        block_size=block_size,
        max_num_seqs=max_seqs,
        scraped_at=time.monotonic() if now is None else now,
    )


def _number(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None
