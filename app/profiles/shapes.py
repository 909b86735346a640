"""The model dimensions the memory model needs, read from a Hugging Face checkpoint's config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1024**3

DATA = Path(__file__).parent / "data"
DEFAULT_CONFIG = DATA / "paddleocr-vl-1.5" / "config.json"
"""PaddleOCR-VL 1.5's config.json, trimmed to what the memory model reads."""

_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class ShapeError(ValueError):
    """A config.json lacks a dimension the memory model needs."""


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a PaddleOCR-VL-style checkpoint (language model + vision tower)."""

    source: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    vision_hidden_size: int
    vision_intermediate_size: int
    max_visual_tokens_per_image: int
    weights_bytes: int

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache per token: layers x KV heads x head_dim x (K and V) x dtype bytes."""
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_bytes


def _int(section: dict[str, Any], key: str, source: Path) -> int:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{source}: `{key}` must be a positive integer; got {value!r}")
    return value


def _estimate_weights(text: dict[str, Any], vision: dict[str, Any], dims: dict[str, int]) -> int:
    """Parameter count x 2 bytes, for configs that do not state what vLLM loads."""
    hidden, inter, vocab = dims["hidden"], dims["inter"], dims["vocab"]
    q_dim = dims["heads"] * dims["head_dim"]
    kv_dim = dims["kv_heads"] * dims["head_dim"]
    layer = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * inter
    heads = 1 if text.get("tie_word_embeddings", False) else 2
    text_params = dims["layers"] * layer + heads * vocab * hidden
    v_hidden, v_inter = dims["v_hidden"], dims["v_inter"]
    v_layers = int(vision.get("num_hidden_layers", 0))
    merged = v_hidden * 4  # the 2x2 projector concatenates four patches
    vision_params = v_layers * (4 * v_hidden * v_hidden + 2 * v_hidden * v_inter)
    projector_params = merged * merged + merged * hidden
    return 2 * (text_params + vision_params + projector_params)


def _max_visual_tokens(config_path: Path) -> int:
    """Visual tokens of the largest image the processor lets through (1,280 for 1.5/1.6)."""
    for name in _PROCESSOR_FILES:
        path = config_path.with_name(name)
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        processor = data.get("image_processor", data)
        size = processor.get("size") or {}
        max_pixels = processor.get("max_pixels") or size.get("longest_edge")
        factor = int(processor.get("patch_size", 14)) * int(processor.get("merge_size", 2))
        if isinstance(max_pixels, int) and max_pixels > 0:
            return max_pixels // (factor * factor)
    return 1280


def load_shape(config_path: Path = DEFAULT_CONFIG) -> ModelShape:
    """Read the dimensions from a config.json (flat or with `text_config`/`vision_config`)."""
    try:
        config: dict[str, Any] = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ShapeError(f"cannot read model config {config_path}: {exc}") from exc
    text: dict[str, Any] = config.get("text_config") or config
    vision: dict[str, Any] = config.get("vision_config") or {}
    hidden = _int(text, "hidden_size", config_path)
    heads = _int(text, "num_attention_heads", config_path)
    head_dim = text.get("head_dim") or hidden // heads
    dims = {
        "layers": _int(text, "num_hidden_layers", config_path),
        "kv_heads": _int(text, "num_key_value_heads", config_path),
        "head_dim": int(head_dim),
        "hidden": hidden,
        "heads": heads,
        "inter": _int(text, "intermediate_size", config_path),
        "vocab": _int(text, "vocab_size", config_path),
        "v_hidden": int(vision.get("hidden_size", 0)),
        "v_inter": int(vision.get("intermediate_size", 0)),
    }
    stated = config.get("ocrvl_weights_gib")
    weights = int(stated * GiB) if stated else _estimate_weights(text, vision, dims)
    return ModelShape(
        source=str(config_path),
        num_layers=dims["layers"],
        num_kv_heads=dims["kv_heads"],
        head_dim=dims["head_dim"],
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=dims["inter"],
        vocab_size=dims["vocab"],
        vision_hidden_size=dims["v_hidden"],
        vision_intermediate_size=dims["v_inter"],
        max_visual_tokens_per_image=_max_visual_tokens(config_path),
        weights_bytes=weights,
    )
