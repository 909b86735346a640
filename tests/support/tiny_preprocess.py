"""Generate tiny, random-weight document preprocessing checkpoints the layout service can load.

Usage::

    python -m tests.support.tiny_preprocess OUT_DIR     # OUT_DIR/orientation, OUT_DIR/unwarping

Nothing is downloaded. Each folder is transformers' own `save_pretrained` of its class:

* `orientation/`: `PPLCNetForImageClassification` (PP-LCNet_x1_0_doc_ori's architecture at a
  quarter of its width, `class_expand` 64), four labels named as the real checkpoint names
  them, `0`, `90`, `180`, `270` (PaddleX reads the angle from the label name);
* `unwarping/`: `UVDocModel` with its default configuration (UVDoc's own, 8 M parameters: the
  model is small already), every bridge's feature map going to the head as in the real one.

The weights are random (seeded), so the classifier's angle is arbitrary but fixed for a page and
the unwarped page is a random warp: the tests check shapes, batching and the API, never what
a page says. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SEED = 49
ANGLES = ("0", "90", "180", "270")


def build_orientation(out: Path) -> Path:
    """The tiny PP-LCNet orientation classifier in `out`."""
    import torch  # noqa: PLC0415
    from transformers import PPLCNetConfig, PPLCNetForImageClassification  # noqa: PLC0415

    torch.manual_seed(SEED)
    config = PPLCNetConfig(
        scale=0.25,
        class_expand=64,
        num_labels=len(ANGLES),
        id2label=dict(enumerate(ANGLES)),
        label2id={label: i for i, label in enumerate(ANGLES)},
    )
    model = PPLCNetForImageClassification(config).eval()
    model.save_pretrained(out)
    return out


def build_unwarping(out: Path) -> Path:
    """The UVDoc unwarping model (random weights) in `out`."""
    import torch  # noqa: PLC0415
    from transformers import UVDocBackboneConfig, UVDocConfig, UVDocModel  # noqa: PLC0415

    torch.manual_seed(SEED)
    backbone = UVDocBackboneConfig()
    backbone = UVDocBackboneConfig(out_features=backbone.stage_names[1:])  # every bridge's map
    model = UVDocModel(UVDocConfig(backbone_config=backbone)).eval()
    model.save_pretrained(out)
    return out


def build(out: Path) -> Path:
    """Both checkpoints under `out` (orientation/, unwarping/)."""
    build_orientation(out / "orientation")
    build_unwarping(out / "unwarping")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    build(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
