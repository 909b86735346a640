"""The worker side: page counts, rendering, and refusals decided from headers alone."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image

from app.documents import raster
from app.documents.errors import DocumentError
from app.documents.selection import PageSelection
from app.documents.sniff import sniff
from tests.support.documents import encrypted_pdf, pdf, pdf_page_of, png_bomb, tiff

LIMIT = 60_000_000


def source(
    tmp_path: Path, data: bytes, dpi: int = 144, max_page_pixels: int = LIMIT
) -> raster.Source:
    """`data` written to a file, as the route spools it."""
    path = tmp_path / "upload"
    path.write_bytes(data)
    return raster.Source(str(path), sniff(data[:1024]), dpi, 112_896, 1_003_520, max_page_pixels)


def decoded(page: raster.RenderedPage) -> Image.Image:
    """The image inside a rendered page's data URL."""
    return Image.open(io.BytesIO(base64.b64decode(page.url.split(",", 1)[1])))


@pytest.mark.parametrize("make", [pdf, tiff], ids=["pdf", "tiff"])
def test_every_page_of_a_multi_page_file_is_found_and_rendered(
    tmp_path: Path, make: object
) -> None:
    """A 3-page PDF or TIFF has 3 pages; each renders to the processor's size as a JPEG."""
    src = source(tmp_path, make(3))  # type: ignore[operator]
    assert raster.inspect(src, None, max_pages=10) == [0, 1, 2]
    for index in range(3):
        page = raster.render(src, index)
        image = decoded(page)
        assert image.format == "JPEG"
        assert image.size == (page.width, page.height)
        assert page.width % 28 == 0
        assert page.height % 28 == 0


def test_pdf_pages_render_at_the_requested_dpi_before_resizing(tmp_path: Path) -> None:
    """A small page at 72 dpi stays small; at 288 dpi it is 4x the area (until max_pixels)."""
    small = raster.render(source(tmp_path, pdf(1, 200, 300), dpi=72), 0)
    large = raster.render(source(tmp_path, pdf(1, 200, 300), dpi=288), 0)
    assert small.width * small.height < large.width * large.height


def test_an_encrypted_pdf_is_refused(tmp_path: Path) -> None:
    """A password-protected PDF is a 400 saying to remove the password."""
    with pytest.raises(DocumentError, match="password") as caught:
        raster.inspect(source(tmp_path, encrypted_pdf()), None, 10)
    assert caught.value.code == "encrypted_pdf"


@pytest.mark.parametrize(
    "data",
    [b"%PDF-1.4\nnot really a pdf", b"\x89PNG\r\n\x1a\ngarbage", b"II*\x00garbage"],
    ids=["pdf", "png", "tiff"],
)
def test_a_corrupt_file_is_refused(tmp_path: Path, data: bytes) -> None:
    """Right magic, broken body: a 400 on `file`."""
    with pytest.raises(DocumentError) as caught:
        raster.inspect(source(tmp_path, data), None, 10)
    assert (caught.value.param, caught.value.code) == ("file", "corrupt_file")


def test_an_image_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    """A 1 KB PNG claiming 100,000 x 100,000 pixels is refused without decoding a row."""
    with pytest.raises(DocumentError, match="OCRVL_MAX_PAGE_PIXELS") as caught:
        raster.inspect(source(tmp_path, png_bomb()), None, 10)
    assert caught.value.code == "image_too_large"


def test_an_image_just_over_the_limit_is_refused(tmp_path: Path) -> None:
    """The limit is ours (OCRVL_MAX_PAGE_PIXELS), not Pillow's default."""
    with pytest.raises(DocumentError, match="90,000 pixels"):
        raster.inspect(source(tmp_path, png_bomb(300, 300), max_page_pixels=80_000), None, 10)


def test_a_pdf_page_too_large_at_the_dpi_is_refused_before_rendering(tmp_path: Path) -> None:
    """A 200-inch page at 144 dpi (829 MP) is refused from its page box; a lower dpi is
    suggested."""
    with pytest.raises(DocumentError, match="lower `dpi`") as caught:
        raster.inspect(source(tmp_path, pdf_page_of(14_400, 14_400)), None, 10)
    assert caught.value.code == "image_too_large"


def test_only_the_selected_pages_are_checked_and_read(tmp_path: Path) -> None:
    """`pages` picks pages before any check: 2 of 5."""
    assert raster.inspect(source(tmp_path, pdf(5)), PageSelection.parse("2,4"), 10) == [1, 3]
