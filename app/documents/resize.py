"""A page image as the model will see it: upright, RGB, resized by PaddleOCR-VL's own rule.

`smart_resize` is the rule of PaddleOCR-VL's image processor, read in
transformers 5.19 `models/paddleocr_vl/image_processing_paddleocr_vl.py` (`smart_resize`,
lines 62-91) and vLLM 0.32 `model_executor/models/paddleocr_vl.py` (`smart_resize`, lines
86-124; the same rule, minus transformers' `max(factor, ...)` guard that only matters past the
200:1 aspect ratio both refuse). factor = patch_size 14 x spatial merge 2 = 28. Sending the
page at exactly that size, with the same min/max pixels in `mm_processor_kwargs`, makes the
engine's own resize a no-op: the gateway sends exactly the pixels the model uses.
"""

from __future__ import annotations

import base64
import io
import math

from PIL import Image, ImageOps

from app.documents.errors import DocumentError

FACTOR = 28  # patch_size 14 x merge_size 2 (preprocessor_config.json)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "TIFF", "BMP")  # the only decoders Pillow may use
MAX_ASPECT = 200
# JPEG at quality 95: a 1 MP text page encodes ~6x faster than PNG and its data URL is a
# fraction of the size (bench/preprocess measures both); PaddleOCR's own client sends JPEG.
JPEG_QUALITY = 95


def smart_resize(
    height: int, width: int, min_pixels: int, max_pixels: int, factor: int = FACTOR
) -> tuple[int, int]:
    """(height, width), both multiples of `factor`, area within [min_pixels, max_pixels]."""
    check_shape("the page", width, height)
    if height < factor:
        width = round((width * factor) / height)
        height = factor
    if width < factor:
        height = round((height * factor) / width)
        width = factor
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def check_shape(where: str, width: int, height: int) -> None:
    """DocumentError `aspect_ratio` when the model's processor would refuse a `width` x `height`
    image (over 200:1 once a side under 28 pixels is lifted to 28, as vLLM's smart_resize
    does): the one rule of chat, /v1/ocr, jobs and batches. `where` names it in the message."""
    if width < 1 or height < 1:
        raise DocumentError(f"{where} is {width}x{height} pixels: it has no area", "invalid_image")
    high, wide = height, width
    if high < FACTOR:
        wide, high = round(wide * FACTOR / high), FACTOR
    if wide < FACTOR:
        high, wide = round(high * FACTOR / wide), FACTOR
    if max(high, wide) / min(high, wide) > MAX_ASPECT:
        raise DocumentError(
            f"{where} is {width}x{height} pixels, over the {MAX_ASPECT}:1 aspect ratio "
            "PaddleOCR-VL's image processor takes; crop it into parts",
            "aspect_ratio",
        )


def check_pixels(where: str, width: int, height: int, most: int, hint: str) -> None:
    """DocumentError `image_too_large` past `most` pixels (OCRVL_MAX_PAGE_PIXELS), read from
    the header: the one rule of chat, /v1/ocr, jobs and batches."""
    if width * height > most:
        raise too_large(where, f"{width * height:,} pixels", most, hint)


def too_large(where: str, size: str, most: int, hint: str) -> DocumentError:
    """The `image_too_large` refusal, worded once (`size`: what the image claims)."""
    return DocumentError(
        f"{where} is {size}, over the {most:,} pixels an image may have (OCRVL_MAX_PAGE_PIXELS; "
        f"decompression bombs are refused unread): {hint}",
        "image_too_large",
    )


def upright_rgb(image: Image.Image) -> Image.Image:
    """`image` turned by its EXIF orientation, transparency laid on white, in RGB."""
    image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I;16"):  # 16-bit grey: its high byte, as OpenCV (PaddleX) reads it
        image = image.convert("I").point(lambda v: v / 256).convert("L")  # convert() would clip
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, "white")
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def for_model(image: Image.Image, min_pixels: int, max_pixels: int) -> Image.Image:
    """`image` upright, RGB, at the size the model's processor would resize it to."""
    image = upright_rgb(image)
    height, width = smart_resize(image.height, image.width, min_pixels, max_pixels)
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling.BICUBIC)  # the processor's resample
    return image


def encode(image: Image.Image, fmt: str = "JPEG") -> bytes:
    """`image` as JPEG (quality 95) or PNG bytes."""
    out = io.BytesIO()
    if fmt == "JPEG":
        image.save(out, format="JPEG", quality=JPEG_QUALITY)
    else:
        image.save(out, format=fmt)
    return out.getvalue()


def data_url(encoded: bytes, fmt: str = "JPEG") -> str:
    """`encoded` as a base64 data: URL."""
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(encoded).decode('ascii')}"


def shrink_data_url(url: str, min_pixels: int, max_pixels: int, max_decoded: int) -> str | None:
    """`url`, a base64 data: URL of an image, as a JPEG q95 data URL at the size the model's
    processor would resize it to, when that is smaller; None to send it as it is.

    None covers everything the engine should decide exactly as without the gateway: an image
    already at (or under) that size, one of another encoding or format, an undecodable one, and
    one over `max_decoded` pixels (read from the header, before any decoding).
    """
    head, comma, payload = url.partition(",")
    if not comma or not head.startswith("data:image/") or not head.endswith(";base64"):
        return None
    try:
        data = base64.b64decode(payload, validate=True)
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            area = image.width * image.height  # from the header; turning upright keeps it
            height, width = smart_resize(image.height, image.width, min_pixels, max_pixels)
            if area > max_decoded or width * height >= area:
                return None  # too big to decode here, or vLLM keeps or enlarges it
            smaller = for_model(image, min_pixels, max_pixels)
    except (OSError, ValueError, DocumentError, Image.DecompressionBombError):
        return None
    return data_url(encode(smaller))
