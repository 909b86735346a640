"""The model's input: a page resized to its size as PaddleX does (pages.py, torch-free), then
scaled on the device with its batch.

PaddleX resizes a page for PP-DocLayoutV3 with OpenCV, `cv2.resize(..., INTER_CUBIC)` to 800x800
without keeping the ratio, then scales by 1/255 with mean 0 and std 1
(paddlex/inference/models/common/vision/processors.py, Resize and Normalize); transformers'
PPDocLayoutV3ImageProcessor approximates that cubic resize with torchvision, which the engine
venv leaves out. So the resize here is OpenCV's, on the 8-bit RGB pixels, and the scaling is done
on the device with the batch (`Preprocessing.normalise`). The sizes and constants are the
checkpoint's own `preprocessor_config.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ocrvl_layout.pages import resize

CONFIG_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class Preprocessing:
    """The model's input size and pixel scaling, from the checkpoint's processor config."""

    width: int = 800
    height: int = 800
    rescale: float = 1 / 255
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    @classmethod
    def of_checkpoint(cls, folder: Path) -> Preprocessing:
        """The folder's preprocessor_config.json (PPDocLayoutV3ImageProcessor's defaults where
        it says nothing)."""
        path = folder / CONFIG_FILE
        config = json.loads(path.read_text()) if path.exists() else {}
        size = config.get("size") or {}
        rescale = config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else 1.0
        normalise = config.get("do_normalize", True)
        return cls(
            width=int(size.get("width", 800)),
            height=int(size.get("height", 800)),
            rescale=float(rescale),
            mean=_triple(config.get("image_mean", 0.0)) if normalise else (0.0, 0.0, 0.0),
            std=_triple(config.get("image_std", 1.0)) if normalise else (1.0, 1.0, 1.0),
        )

    def resize(self, image: np.ndarray) -> np.ndarray:
        """An (H, W, 3) uint8 RGB page at the model's input size, as PaddleX's Resize does it."""
        return resize(image, self.width, self.height)

    def scaling(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """PaddleX's Normalize as x * alpha + beta per channel, on `device` (made once: a CUDA
        graph's pass may not copy from the host)."""
        alpha = torch.tensor([self.rescale / s for s in self.std], device=device)
        shift = [-m / s for m, s in zip(self.mean, self.std, strict=True)]
        beta = torch.tensor(shift, device=device)
        return alpha, beta

    def normalise(
        self, pixels: torch.Tensor, dtype: torch.dtype, scaling: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """A (B, H, W, 3) uint8 batch as the model's (B, 3, H, W) input: PaddleX's Normalize
        (x * scale / std - mean / std, in float32, `scaling` its alpha and beta), then the
        model's dtype."""
        alpha, beta = scaling
        scaled = pixels.to(torch.float32) * alpha + beta
        return scaled.permute(0, 3, 1, 2).contiguous().to(dtype)


def _triple(value: float | list[float]) -> tuple[float, float, float]:
    values = [float(value)] * 3 if isinstance(value, int | float) else [float(v) for v in value]
    return (values[0], values[1], values[2])
