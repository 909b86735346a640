"""Images in: a data: URL decoded and checked, then resized to the model's input as PaddleX does.

PaddleX resizes a page for PP-DocLayoutV3 with OpenCV, `cv2.resize(..., INTER_CUBIC)` to 800x800
without keeping the ratio, then scales by 1/255 with mean 0 and std 1
(paddlex/inference/models/common/vision/processors.py, Resize and Normalize); transformers'
PPDocLayoutV3ImageProcessor approximates that cubic resize with torchvision, which the engine
venv leaves out. So the resize here is OpenCV's, on the 8-bit RGB pixels, and the scaling is done
on the device with the batch (`Preprocessing.normalise`). The sizes and constants are the
checkpoint's own `preprocessor_config.json`.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ocrvl_layout.errors import InvalidRequest, quoted

DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+)(;[^,;]*=[^,;]*)*;base64,", re.IGNORECASE)
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
        return cv2.resize(image, (self.width, self.height), interpolation=cv2.INTER_CUBIC)

    def normalise(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A (B, H, W, 3) uint8 batch as the model's (B, 3, H, W) input: PaddleX's Normalize
        (x * scale / std - mean / std, in float32), then the model's dtype."""
        alpha = torch.tensor([self.rescale / s for s in self.std], device=pixels.device)
        beta = torch.tensor(
            [-m / s for m, s in zip(self.mean, self.std, strict=True)], device=pixels.device
        )
        scaled = pixels.to(torch.float32) * alpha + beta
        return scaled.permute(0, 3, 1, 2).contiguous().to(dtype)


def _triple(value: float | list[float]) -> tuple[float, float, float]:
    values = [float(value)] * 3 if isinstance(value, int | float) else [float(v) for v in value]
    return (values[0], values[1], values[2])


def decode(url: str, index: int, max_pixels: int) -> np.ndarray:
    """The RGB pixels of `images[index]`, an image data: URL, as an (H, W, 3) uint8 array.

    The pixel grid is the file's own: EXIF orientation is not applied, so coordinates are in the
    pixels as stored, as the pipeline that crops them reads them.
    """
    param = f"images.{index}"
    match = DATA_URL.match(url)
    if match is None:
        raise InvalidRequest(
            f"images[{index}] must be a data:image/...;base64,... URL; got {quoted(url[:60])}",
            param=param,
            code="invalid_image",
        )
    try:
        data = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            f"images[{index}]: the base64 payload does not decode",
            param=param,
            code="invalid_image",
        ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise _too_large(index, width, height, max_pixels)
            image.load()
            return np.asarray(image.convert("RGB"))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise InvalidRequest(
                f"images[{index}] has more pixels than is safe to decode; "
                f"at most {max_pixels} (--max-pixels)",
                param=param,
                code="image_too_large",
            ) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
            raise InvalidRequest(
                f"images[{index}] ({match.group(1)}) is not an image this service can read: "
                f"{quoted(str(error), 120)}",
                param=param,
                code="invalid_image",
            ) from None


def _too_large(index: int, width: int, height: int, max_pixels: int) -> InvalidRequest:
    return InvalidRequest(
        f"images[{index}] is {width}x{height} = {width * height} pixels; "
        f"at most {max_pixels} (--max-pixels)",
        param=f"images.{index}",
        code="image_too_large",
    )
