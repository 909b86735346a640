"""The full-size random checkpoint (`python -m tests.support.tiny_model DIR --full`) for GPUs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY
from tests.support.tiny_model import (
    PROFILE_MODEL,
    TINY,
    _build_config,
    _build_tokenizer,
    _vocab,
    full_dims,
)

pytestmark = pytest.mark.engine
torch = pytest.importorskip("torch", reason=ENGINE_ONLY)
transformers = pytest.importorskip("transformers", reason=ENGINE_ONLY)
Built = tuple[Any, Any, dict[str, int]]  # tokenizer, config, vocabulary
REAL_IDS = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "<|IMAGE_PLACEHOLDER|>": 100295,
    "<|VIDEO_PLACEHOLDER|>": 100296,
    "<|IMAGE_START|>": 101305,
    "<|IMAGE_END|>": 101306,
}


@pytest.fixture(scope="module")
def built() -> Built:
    """The full mode's tokenizer, config and vocabulary (no weights)."""
    dims = full_dims()
    tokenizer, vocab = _build_tokenizer(dims)
    return tokenizer, _build_config(vocab, dims), vocab


def test_the_vocabulary_keeps_the_real_ids_and_size(built: Built) -> None:
    """103,424 ids, each used once, and the special tokens where the real tokenizer has them."""
    tokenizer, _, vocab = built
    assert len(vocab) == len(set(vocab.values())) == 103_424
    assert set(vocab.values()) == set(range(103_424))
    assert {token: vocab[token] for token in REAL_IDS} == REAL_IDS
    assert tokenizer.convert_tokens_to_ids("<|IMAGE_PLACEHOLDER|>") == 100295
    assert tokenizer.decode(tokenizer("Total: 12.50")["input_ids"]) == "Total: 12.50"


def test_the_config_has_the_profiles_shapes_and_token_ids(
    built: Built,
) -> None:
    """Every dimension the memory model reads equals the profile's config.json."""
    _, config, _ = built
    real = json.loads((PROFILE_MODEL / "config.json").read_text())
    made = config.to_dict()
    for part in ("text_config", "vision_config"):
        for key, value in real[part].items():
            if key != "model_type":
                assert made[part][key] == value, (part, key)
    assert made["image_token_id"] == 100295
    assert made["video_token_id"] == 100296
    assert (made["vision_start_token_id"], made["vision_end_token_id"]) == (101305, 101306)
    assert made["text_config"]["rope_parameters"]["mrope_section"] == [16, 24, 24]


def test_the_full_model_has_the_real_parameter_count(built: Built) -> None:
    """Built on the meta device (no memory): 905.6 M parameters, as the real checkpoint."""
    _, config, _ = built
    with torch.device("meta"):
        model = transformers.PaddleOCRVLForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == pytest.approx(905.6e6, rel=0.005)
    assert full_dims().kv_bytes_per_token == 18 * 2 * 128 * 2 * 2


def test_the_tiny_mode_is_unchanged() -> None:
    """The default stays the CPU checkpoint: 204 tokens numbered in order, 2 KiB of KV a token."""
    vocab = _vocab(TINY)
    assert list(vocab.values()) == list(range(len(vocab)))
    assert TINY.kv_bytes_per_token == 2048
    assert TINY.dtype == "float32"
