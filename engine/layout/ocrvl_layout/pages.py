"""A page's host work, torch-free (the worker processes of workers.py import only this side):
its data: URL decoded and checked, resized to the model's input as PaddleX does, and, after the
forward pass, its candidates post-processed into the answer's boxes.

PaddleX resizes a page for PP-DocLayoutV3 with OpenCV, `cv2.resize(..., INTER_CUBIC)` to 800x800
without keeping the ratio (paddlex/inference/models/common/vision/processors.py, Resize); the
scaling by 1/255 is done on the device with the batch (images.py, `Preprocessing.normalise`).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from ocrvl_layout import slots
from ocrvl_layout.boxes import Candidates
from ocrvl_layout.errors import InvalidRequest, quoted
from ocrvl_layout.options import LayoutOptions
from ocrvl_layout.postprocess import layout_boxes
from ocrvl_layout.slots import Address

DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+)(;[^,;]*=[^,;]*)*;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class Prepared:
    """A page at the model's input size and the size it was sent at (the full-size pixels stay
    where they were decoded)."""

    pixels: np.ndarray  # (H, W, 3) uint8 at the model's input size
    width: int
    height: int


def prepare(url: str, index: int, max_pixels: int, size: tuple[int, int]) -> Prepared:
    """`images[index]` decoded and resized to `size` (width, height)."""
    pixels = decode(url, index, max_pixels)
    height, width = pixels.shape[:2]
    return Prepared(resize(pixels, *size), width, height)


def prepare_into(
    url: str, index: int, max_pixels: int, address: Address, slot: int
) -> tuple[int, int]:
    """`images[index]` decoded and resized into slot `slot` of the service's page slots (the
    model's input size is the slots' shape); the (width, height) it was sent at."""
    pixels = decode(url, index, max_pixels)
    height, width = pixels.shape[:2]
    into = slots.write(address, slot)
    resized = cv2.resize(pixels, (into.shape[1], into.shape[0]), dst=into,
                         interpolation=cv2.INTER_CUBIC)  # fmt: skip
    if resized is not into:  # OpenCV made an array of its own: copy it in
        np.copyto(into, resized)
    return width, height


def finish(found: Candidates, labels: list[str], options: LayoutOptions) -> dict[str, Any]:
    """A page's answer: its size and its final boxes (PaddleX's post-processing)."""
    boxes = layout_boxes(found, labels, options)
    return {"width": found.width, "height": found.height, "boxes": boxes}


def resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """An (H, W, 3) uint8 RGB page at `width` x `height`, as PaddleX's Resize does it."""
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)


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
