"""Generate a tiny, random-weight PaddleOCR-VL checkpoint that a real (CPU) vLLM can serve.

Usage::

    python -m tests.support.tiny_model OUT_DIR

or ``build_tiny_model(Path(...))`` from Python.

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
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Shapes. CPU attention in vLLM supports head_dim 32, 64, 80, 96, ... 512 only (16 starts and then
# kills the engine on the first request); the M-RoPE sections must add up to head_dim / 2.
# ---------------------------------------------------------------------------------------------
SEED = 1234
DTYPE = "float32"  # vllm_configs/cpu.yaml says why; must match its `dtype`
DTYPE_BYTES = 4

TEXT_HIDDEN = 256
TEXT_INTERMEDIATE = 512
TEXT_LAYERS = 2
TEXT_HEADS = 4
TEXT_KV_HEADS = 2
TEXT_HEAD_DIM = 64
MROPE_SECTION = [8, 12, 12]  # sums to TEXT_HEAD_DIM // 2, same proportions as the real [16, 24, 24]
MAX_POSITION_EMBEDDINGS = 8192
ROPE_THETA = 500000.0

VISION_HIDDEN = 64
VISION_INTERMEDIATE = 128
VISION_LAYERS = 2
VISION_HEADS = 2  # vision head_dim 32
PATCH_SIZE = 14
MERGE_SIZE = 2
VISION_IMAGE_SIZE = 384  # 27x27 learned position table, interpolated per image like the real one

# One image token per (PATCH_SIZE * MERGE_SIZE)^2 = 784 pixels after resizing.
# Defaults: 16 to 256 image tokens. A request's mm_processor_kwargs may override them (the
# PaddleOCR client sends min_pixels=112896, max_pixels=1003520, i.e. 144 to 1280 tokens).
MIN_PIXELS = 28 * 28 * 16  # 12544
MAX_PIXELS = 28 * 28 * 256  # 200704

KV_BYTES_PER_TOKEN = TEXT_LAYERS * TEXT_KV_HEADS * TEXT_HEAD_DIM * 2 * DTYPE_BYTES

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


def _vocab() -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token in SPECIAL_TOKENS + CHARACTERS:
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


def _build_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import AddedToken, Tokenizer, decoders, models  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    vocab = _vocab()
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
        model_max_length=MAX_POSITION_EMBEDDINGS,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if tokenizer.image_token_id != vocab[IMAGE_TOKEN]:
        raise RuntimeError("the tokenizer does not expose image_token_id")
    return tokenizer, vocab


def _build_config(vocab: dict[str, int]):  # type: ignore[no-untyped-def]
    from transformers import PaddleOCRVLConfig  # noqa: PLC0415

    text_config = {
        "vocab_size": len(vocab),
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": TEXT_INTERMEDIATE,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": TEXT_HEADS,
        "num_key_value_heads": TEXT_KV_HEADS,
        "head_dim": TEXT_HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-5,
        "use_bias": False,
        "pad_token_id": vocab[UNK],
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "tie_word_embeddings": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "mrope_section": MROPE_SECTION,
        },
    }
    vision_config = {
        "hidden_size": VISION_HIDDEN,
        "intermediate_size": VISION_INTERMEDIATE,
        "num_hidden_layers": VISION_LAYERS,
        "num_attention_heads": VISION_HEADS,
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


def _build_model(config):  # type: ignore[no-untyped-def]
    import torch  # noqa: PLC0415
    from transformers import PaddleOCRVLForConditionalGeneration  # noqa: PLC0415

    torch.manual_seed(SEED)
    model = PaddleOCRVLForConditionalGeneration(config).to(getattr(torch, DTYPE))
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


def _build_processor(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import PaddleOCRVLProcessor  # noqa: PLC0415
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import (  # noqa: PLC0415
        PaddleOCRVLImageProcessorPil,
    )

    image_processor = PaddleOCRVLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
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


def build_tiny_model(out_dir: Path) -> Path:
    """Write the tiny checkpoint into ``out_dir`` (created if needed) and return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, vocab = _build_tokenizer()
    config = _build_config(vocab)
    model = _build_model(config)
    processor = _build_processor(tokenizer)

    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    # The tokenizer carries the template too, for clients that load only the tokenizer.
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    (out_dir / "tiny_model.json").write_text(
        json.dumps(
            {
                "generator": "tests/support/tiny_model.py",
                "seed": SEED,
                "dtype": DTYPE,
                "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
                "num_hidden_layers": TEXT_LAYERS,
                "num_key_value_heads": TEXT_KV_HEADS,
                "head_dim": TEXT_HEAD_DIM,
                "min_pixels": MIN_PIXELS,
                "max_pixels": MAX_PIXELS,
            },
            indent=2,
        )
        + "\n"
    )
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the checkpoint into")
    args = parser.parse_args(argv)
    path = build_tiny_model(args.out_dir)
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    print(f"tiny PaddleOCR-VL written to {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
