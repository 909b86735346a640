"""PP-LCNet_x1_0_doc_ori through transformers' own class: a page's angle, and the page turned.

PaddleX's `DocPreprocessor` (`pipelines/doc_preprocessor/pipeline.py`) classifies each page
into 0, 90, 180 or 270 degrees (the label's name is the angle) and turns it back with
`rotate_image(img, angle)`: OpenCV's `warpAffine` counter-clockwise by `angle` about the
page's centre, the canvas grown to fit. At a right angle that is the page's exact rotation
shifted by one pixel (down at 90, down and right at 180, right at 270: the centre is `w/2`,
not `(w-1)/2`), the row or column it leaves black; `turned` makes exactly that (checked
against PaddleX's own function on pages of odd and even sizes). The classifier reads the
page as transformers' `PPLCNetImageProcessor` prepares it (the short side resized to 256,
bilinear; a centred 224 x 224 crop; 1/255; its mean and standard deviation), written with torch
alone: the processor needs torchvision, which the engine venv leaves out.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PPLCNetForImageClassification

from ocrvl_layout.model import CheckpointError, place, pretrained

RESIZE_SHORT = 256
CROP = 224
MEAN = (0.406, 0.456, 0.485)  # PPLCNetImageProcessor's
STD = (0.225, 0.224, 0.229)
SHIFTS = {90: (1, 0), 180: (1, 1), 270: (0, 1)}  # rotate_image's (down, right) shift


class OrientationModel:
    """The classifier on its device, and its angles by class id."""

    def __init__(self, checkpoint: str, device: torch.device, dtype: torch.dtype) -> None:
        model = pretrained(PPLCNetForImageClassification, checkpoint, dtype, "pp_lcnet", "PP-LCNet")
        names = {int(k): str(v) for k, v in (model.config.id2label or {}).items()}
        angles = [int(names[i]) if names.get(i, "").isdigit() else -1 for i in sorted(names)]
        if sorted(angles) != [0, 90, 180, 270]:
            raise CheckpointError(
                f"{checkpoint}: its labels are {list(names.values())}, "
                "not the angles 0, 90, 180, 270"
            )
        self.angles = angles
        self.device, self.dtype = device, dtype
        self.model = place(model, device)
        self.parameters = sum(p.numel() for p in self.model.parameters())

    @torch.inference_mode()
    def angles_of(self, pages: list[np.ndarray]) -> list[int]:
        """Each page's angle (one forward pass over all of them)."""
        batch = torch.stack([self._input(page) for page in pages]).to(self.device, self.dtype)
        logits = self.model(pixel_values=batch).last_hidden_state
        return [self.angles[int(i)] for i in logits.float().argmax(-1).tolist()]

    def _input(self, page: np.ndarray) -> torch.Tensor:
        """The processor's steps on one (H, W, 3) uint8 RGB page: (3, 224, 224) float."""
        image = torch.from_numpy(np.array(page)).permute(2, 0, 1).float()
        height, width = image.shape[1:]
        scale = RESIZE_SHORT / min(height, width)
        size = (max(round(height * scale), 1), max(round(width * scale), 1))
        image = F.interpolate(image[None], size=size, mode="bilinear", antialias=True)[0]
        image = image.clamp(0, 255).round()  # the processor resizes uint8 pixels
        image = _centre_crop(image, CROP)
        mean = torch.tensor(MEAN).view(3, 1, 1)
        std = torch.tensor(STD).view(3, 1, 1)
        return (image / 255 - mean) / std


def _centre_crop(image: torch.Tensor, side: int) -> torch.Tensor:
    """A centred `side` x `side` crop, padded with black where the image is smaller."""
    height, width = image.shape[1:]
    if height < side or width < side:
        pad_w, pad_h = max(side - width, 0), max(side - height, 0)
        image = F.pad(image, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2))
        height, width = image.shape[1:]
    top, left = int((height - side) / 2.0), int((width - side) / 2.0)
    return image[:, top : top + side, left : left + side]


def turned(page: np.ndarray, angle: int) -> np.ndarray:
    """`rotate_image(page, angle)`: the page turned counter-clockwise by `angle`, shifted by
    OpenCV's pixel."""
    if angle == 0:
        return page
    rotated = np.rot90(page, angle // 90)  # counter-clockwise
    down, right = SHIFTS[angle]
    out = np.zeros_like(rotated)
    height, width = rotated.shape[:2]
    out[down:, right:] = rotated[: height - down, : width - right]
    return out
