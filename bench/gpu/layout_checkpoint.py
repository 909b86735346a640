"""A full-size PP-DocLayoutV3 checkpoint with random weights, for the layout service on a GPU.

    python -m bench.gpu.layout_checkpoint DIR [--seed 0]

transformers' own `PPDocLayoutV3Config` defaults are the released architecture (HGNetV2-L
backbone, hybrid encoder, 6-layer deformable decoder, 300 queries, the global-pointer reading
order head): with the 25 labels of PaddleX's conversion config for `PP-DocLayoutV3` they give
33,175,165 parameters, the 33.2 M of the real checkpoint (tests/bench/gpu/test_layout_checkpoint.py
checks both). Saved as transformers saves it (config.json, model.safetensors) with the default
image processor's config (800x800, what the service resizes pages to), so `python -m
ocrvl_layout --model DIR` loads it as it loads the real `PaddlePaddle/PP-DocLayoutV3_safetensors`.
Random weights give random boxes: timing only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# PaddleX 3.x (paddlex/modules/base/utils/pdparams2safetensors/model_config.py,
# _DOCLAYOUTV3_CONFIG): the real checkpoint's id2label, duplicates and all
LABELS = (
    "abstract", "algorithm", "aside_text", "chart", "content", "formula", "doc_title",
    "figure_title", "footer", "footer", "footnote", "formula_number", "header", "header",
    "image", "formula", "number", "paragraph_title", "reference", "reference_content", "seal",
    "table", "text", "text", "vision_footnote",
)  # fmt: skip
PARAMETERS = 33_175_165


def build(out: Path, seed: int = 0) -> int:
    """Write the checkpoint into `out`; its parameter count."""
    import torch  # noqa: PLC0415 (the engine venv's; the gateway's has none)
    from transformers import (  # noqa: PLC0415
        PPDocLayoutV3Config,
        PPDocLayoutV3ForObjectDetection,
        PPDocLayoutV3ImageProcessor,
    )

    torch.manual_seed(seed)
    config = PPDocLayoutV3Config(id2label=dict(enumerate(LABELS)))
    model = PPDocLayoutV3ForObjectDetection(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    try:
        PPDocLayoutV3ImageProcessor().save_pretrained(out)
    except ImportError:  # it needs torchvision (the GPU host has it; the CPU engine venv not)
        processor = {"image_processor_type": "PPDocLayoutV3ImageProcessor"}  # its defaults
        (out / "preprocessor_config.json").write_text(json.dumps(processor) + "\n")
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.layout_checkpoint")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    began = time.monotonic()
    count = build(args.out, args.seed)
    print(f"PP-DocLayoutV3, random weights: {count:,} parameters in {args.out} "
          f"({time.monotonic() - began:.0f} s)")  # fmt: skip
    return 0 if count == PARAMETERS else 1


if __name__ == "__main__":
    sys.exit(main())
