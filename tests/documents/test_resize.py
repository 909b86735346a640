"""Pages are resized by the model processor's own rule, upright and in RGB."""

from __future__ import annotations

import io
import itertools

import pytest
from PIL import Image

from app.documents import resize
from app.documents.errors import DocumentError
from tests.support.documents import rotated_jpeg, transparent_png

MIN_PIXELS, MAX_PIXELS = 112_896, 1_003_520  # PaddleOCR-VL 1.5's preprocessor_config.json
SIZES = [1, 27, 28, 29, 100, 333, 640, 1000, 1240, 1754, 2480, 3508, 5000]


def test_smart_resize_is_the_processors_own_rule() -> None:
    """Over a grid of page sizes, the gateway's rule gives exactly what transformers'
    PaddleOCR-VL image processor computes (so the engine resizes nothing more)."""
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import (  # noqa: PLC0415
        smart_resize as reference,
    )

    for height, width in itertools.product(SIZES, SIZES):
        if max(height, width) / min(height, width) > 150:
            continue  # past the 200:1 limit once the short side is raised to 28
        expected = reference(height, width, 28, MIN_PIXELS, MAX_PIXELS)
        assert resize.smart_resize(height, width, MIN_PIXELS, MAX_PIXELS) == expected


@pytest.mark.parametrize(("height", "width"), [(1754, 1240), (100, 100), (5000, 400)])
def test_resized_pages_are_multiples_of_28_within_the_pixel_bounds(height: int, width: int) -> None:
    """Both sides multiples of 28; the area between min_pixels and max_pixels."""
    h, w = resize.smart_resize(height, width, MIN_PIXELS, MAX_PIXELS)
    assert h % 28 == 0
    assert w % 28 == 0
    assert MIN_PIXELS <= h * w <= MAX_PIXELS


def test_a_page_past_200_to_1_is_refused() -> None:
    """The processor's aspect limit becomes a 400 on `file`, not a crash in the engine."""
    with pytest.raises(DocumentError, match="aspect ratio"):
        resize.smart_resize(10_000, 40, MIN_PIXELS, MAX_PIXELS)


def test_exif_orientation_is_applied() -> None:
    """A landscape JPEG tagged 'rotate 90°' is sent as the portrait page the camera meant."""
    image = Image.open(io.BytesIO(rotated_jpeg(300, 200, orientation=6)))
    page = resize.for_model(image, MIN_PIXELS, MAX_PIXELS)
    assert page.height > page.width
    assert (
        page.getpixel((page.width - 5, 5)) == (0, 0, 0)
        or page.getpixel((page.width - 5, 5))[0] < 60
    )


def test_transparency_is_laid_on_white_and_sent_as_rgb() -> None:
    """A transparent PNG becomes white RGB (not black, which would hide dark text)."""
    page = resize.for_model(Image.open(io.BytesIO(transparent_png())), MIN_PIXELS, MAX_PIXELS)
    assert page.mode == "RGB"
    assert page.getpixel((10, 10)) == (255, 255, 255)


def test_encoding_gives_a_jpeg_data_url() -> None:
    """The page travels as a JPEG (quality 95) data URL."""
    page = Image.new("RGB", (56, 56), "white")
    url = resize.data_url(resize.encode(page))
    assert url.startswith("data:image/jpeg;base64,/9j/")
