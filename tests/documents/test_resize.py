"""Pages are resized by the model processor's own rule, upright and in RGB."""

from __future__ import annotations

import base64
import io
import itertools

import pytest
from PIL import Image

from app.documents import resize
from app.documents.errors import DocumentError
from tests.support.documents import rotated_jpeg, transparent_png

MIN_PIXELS, MAX_PIXELS = 112_896, 1_003_520  # PaddleOCR-VL 1.5's preprocessor_config.json
SIZES = [1, 27, 28, 29, 100, 333, 640, 1000, 1240, 1754, 2480, 3508, 5000]


@pytest.mark.engine
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


def _decoded(url: str) -> Image.Image:
    head, _, payload = url.partition(",")
    assert head == "data:image/jpeg;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def _page(width: int, height: int, fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (250, 250, 250)).save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize(("width", "height"), [(1240, 1754), (1654, 2339), (3000, 800)])
def test_a_chat_image_over_the_budget_shrinks_to_the_processors_size(
    width: int, height: int
) -> None:
    """OCRVL_RESIZE_IMAGES: a page larger than the budget comes back as a JPEG at exactly
    smart_resize of its size, which vLLM's processor then leaves as it is."""
    url = f"data:image/jpeg;base64,{base64.b64encode(_page(width, height)).decode()}"
    smaller = resize.shrink_data_url(url, MIN_PIXELS, MAX_PIXELS, 60_000_000)
    assert smaller is not None
    image = _decoded(smaller)
    assert image.size == resize.smart_resize(height, width, MIN_PIXELS, MAX_PIXELS)[::-1]
    assert resize.smart_resize(image.height, image.width, MIN_PIXELS, MAX_PIXELS) == (
        image.height,
        image.width,
    )


def test_a_chat_image_is_turned_upright_and_laid_on_white_as_vllm_does() -> None:
    """EXIF orientation and transparency are applied as vLLM's own loader applies them."""
    rotated = f"data:image/jpeg;base64,{base64.b64encode(rotated_jpeg(3000, 2000, 6)).decode()}"
    image = _decoded(resize.shrink_data_url(rotated, MIN_PIXELS, MAX_PIXELS, 60_000_000) or "")
    assert image.height > image.width  # the portrait page the camera meant
    clear = f"data:image/png;base64,{base64.b64encode(transparent_png(2400, 2400)).decode()}"
    image = _decoded(resize.shrink_data_url(clear, MIN_PIXELS, MAX_PIXELS, 60_000_000) or "")
    assert image.mode == "RGB"
    assert min(image.getpixel((0, 0))) >= 250  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(None, id="already-at-its-size"),
        pytest.param("small", id="under-min-pixels"),
        pytest.param("https://example.com/page.jpg", id="not-a-data-url"),
        pytest.param("data:image/jpeg,rawbytes", id="not-base64"),
        pytest.param("data:text/plain;base64,aGVsbG8=", id="not-an-image-type"),
        pytest.param("data:image/jpeg;base64,%%%notbase64", id="bad-base64"),
        pytest.param("data:image/jpeg;base64," + base64.b64encode(b"no image").decode(),
                     id="undecodable"),
        pytest.param("gif", id="a-format-the-gateway-does-not-decode"),
        pytest.param("bomb", id="over-max-decoded-pixels"),
    ],
)  # fmt: skip
def test_a_chat_image_the_gateway_need_not_or_cannot_shrink_goes_as_sent(url: str | None) -> None:
    """None (send it untouched, vLLM decides as before) for every image the gateway would
    not make smaller or may not decode."""
    if url is None:
        url = f"data:image/png;base64,{base64.b64encode(_page(840, 1176, 'PNG')).decode()}"
    elif url == "small":
        url = f"data:image/png;base64,{base64.b64encode(_page(200, 300, 'PNG')).decode()}"
    elif url == "gif":
        url = f"data:image/gif;base64,{base64.b64encode(_page(2000, 3000, 'GIF')).decode()}"
    elif url == "bomb":
        url = f"data:image/png;base64,{base64.b64encode(_page(4000, 4000, 'PNG')).decode()}"
    assert resize.shrink_data_url(url, MIN_PIXELS, MAX_PIXELS, 10_000_000) is None
