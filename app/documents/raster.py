"""Pages out of files, run in the worker processes: never on the event loop.

Every size check reads a header only (Pillow's `open` parses the header and decodes nothing;
pypdfium2 gives a page's size without rendering it), so a decompression bomb is refused before
a single pixel is decoded.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_raw
from PIL import Image, UnidentifiedImageError

from app.documents import resize, spotting
from app.documents.errors import DocumentError
from app.documents.selection import PageSelection, resolve
from app.documents.sniff import FileKind, sniff

if TYPE_CHECKING:
    from app.settings import Settings

IMAGE_FORMATS = resize.IMAGE_FORMATS
POINTS_PER_INCH = 72
PDFIUM_ERRORS = {  # FPDF_GetLastError's codes (fpdfview.h) for a load that failed
    pdfium_raw.FPDF_ERR_UNKNOWN: "unknown error",
    pdfium_raw.FPDF_ERR_FILE: "file not found or could not be opened",
    pdfium_raw.FPDF_ERR_FORMAT: "not in PDF format or corrupted",
    pdfium_raw.FPDF_ERR_SECURITY: "unsupported security scheme",
    pdfium_raw.FPDF_ERR_PAGE: "page not found or content error",
}
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Source:
    """One uploaded file on disk and how to read it (picklable: it crosses to the workers)."""

    path: str
    kind: FileKind
    dpi: int
    min_pixels: int
    max_pixels: int
    max_page_pixels: int
    spotting: bool = False  # a page read whole for spotting: enlarged first, as PaddleX does

    @classmethod
    def sniffed(cls, path: str, head: bytes, dpi: int, settings: Settings) -> Source:
        """The spooled file at `path` (its first bytes `head`), read at `dpi` under the
        gateway's pixel caps; DocumentError when it is no image or PDF."""
        return cls(
            path, sniff(head), dpi, settings.ocr_min_pixels, settings.max_pixels,
            settings.max_page_pixels,
        )  # fmt: skip

    def for_spotting(self, most: int) -> Source:
        """Read whole for spotting: enlarged as PaddleX enlarges it, within its spotting pixel
        bounds held to `most` (OCRVL_MAX_PIXELS)."""
        high = min(spotting.PIXELS[1], most)
        low = min(spotting.PIXELS[0], high)
        return replace(self, min_pixels=low, max_pixels=high, spotting=True)


@dataclass(frozen=True, slots=True)
class RenderedPage:
    """A page ready for the model: a JPEG data URL at the processor's size."""

    url: str
    width: int
    height: int
    page_size: tuple[int, int] | None = None  # a spotted page's, upright, before any resize


@dataclass(frozen=True, slots=True)
class Keep:
    """Where a worker may keep a page's pixels for the gateway, and how many bytes at most."""

    folder: str
    most: int


@dataclass(frozen=True, slots=True)
class Pixels:
    """A page at full resolution (`page_image`'s) kept in a file as raw RGB bytes, width x
    height x 3: what a laid-out page's layout image and crops are made from, so that the page
    is rasterised once. A file, not the bytes: a worker's result crosses a pipe, ~15 ms for an
    A4 page's 6 MB against ~1 ms to write and read them (the gateway deletes the file)."""

    path: str
    width: int
    height: int

    @property
    def size(self) -> int:
        """Its bytes."""
        return self.width * self.height * 3

    @classmethod
    def kept(
        cls, image: Image.Image, keep: Keep | None, data: bytes | None = None
    ) -> Pixels | None:
        """`image` (RGB; `data`: its bytes, when made already) kept in `keep`'s folder; None
        when none is asked for, it would be over `keep.most` bytes or the folder is full."""
        if keep is None or image.width * image.height * 3 > keep.most:
            return None
        try:
            fd, path = tempfile.mkstemp(suffix=".rgb", dir=keep.folder)
        except OSError:  # the folder is gone (the gateway stopping) or full
            return None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data if data is not None else image.tobytes())
        except OSError:  # full: the page is rasterised again where it is needed
            os.unlink(path)
            return None
        return cls(path, image.width, image.height)

    def image(self, source: Source, index: int) -> Image.Image:
        """The page again, as `page_image` gave it; rendered again if its file has gone (by
        another gateway's hand: one that took this one's folder for a dead gateway's)."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return page_image(source, index)
        return Image.frombytes("RGB", (self.width, self.height), data)


def inspect(source: Source, selection: PageSelection | None, max_pages: int) -> list[int]:
    """The 0-based pages to read, after the page-count and pixel checks (no decoding)."""
    if source.kind.is_pdf:
        return _inspect_pdf(source, selection, max_pages)
    with _open_image(source) as image, _quiet_decoder(source, "read"):
        pages = resolve(selection, getattr(image, "n_frames", 1), max_pages)
        for index in pages:
            image.seek(index)
            _check_pixels(source, index, image.width, image.height)
        return pages


def render(source: Source, index: int) -> RenderedPage:
    """Page `index` rasterised or decoded, upright, RGB, resized for the model, encoded."""
    return _decoded(source, index, lambda image: _finish(source, image), forms=False)


def page_image(source: Source, index: int) -> Image.Image:
    """Page `index` at full resolution, upright and RGB: what the layout pipeline crops blocks
    from. A PDF page is rendered at the requested dpi with its form fields drawn (PaddleX's
    PDF reader: pypdfium2, `init_forms()`, scale 2 at the default 144 dpi), never shrunk."""
    return _decoded(source, index, resize.upright_rgb, forms=True)


def _decoded(source: Source, index: int, then: Callable[[Image.Image], T], *, forms: bool) -> T:
    """`then` of page `index` as PIL gives it, while its file is open: a PDF page rendered (with
    its form fields drawn when `forms`, at the requested dpi, else at the scale the model's
    pixel bounds ask for), an image's frame decoded; both after the pixel check."""
    if source.kind.is_pdf:
        document = _open_pdf(source.path)
        try:
            if forms:
                document.init_forms()
            width, height = _pdf_pixels(source, document, index)
            _check_pixels(source, index, width, height)
            scale = source.dpi / POINTS_PER_INCH if forms else _render_scale(source, width, height)
            return then(document[index].render(scale=scale).to_pil())
        except pdfium.PdfiumError as exc:
            raise DocumentError(
                f"page {index + 1} of the PDF cannot be rendered: {exc}", "corrupt_file"
            ) from None
        finally:
            document.close()
    with _open_image(source) as image, _quiet_decoder(source, f"decode page {index + 1} of"):
        image.seek(index)
        _check_pixels(source, index, image.width, image.height)
        image.load()
        return then(image)


def _render_scale(source: Source, width: int, height: int) -> float:
    """Points to pixels: the requested dpi, or less when the model will shrink the page anyway.

    Rendering an A4 page at 144 dpi (2 MP) and then resizing it to the model's 1 MP costs twice
    the rasterising and a large resize; rendering straight at the model's size (a little over,
    then a small exact resize) gives a page of the same size in ~80 ms instead of ~190 ms
    (one A4 text page, measured on the 2-core dev machine).
    """
    scale = source.dpi / POINTS_PER_INCH
    if source.spotting:  # whether it is enlarged depends on its size at the requested dpi
        return scale
    target_h, target_w = resize.smart_resize(height, width, source.min_pixels, source.max_pixels)
    shrink = max(target_w / width, target_h / height)
    return scale * shrink if shrink < 1 else scale


def _finish(source: Source, image: Image.Image) -> RenderedPage:
    size = None
    if source.spotting:  # rendered at its dpi (_render_scale): the size PaddleX's page has
        image = resize.upright_rgb(image)
        size, image = image.size, spotting.enlarged(image)
    page = resize.for_model(image, source.min_pixels, source.max_pixels)
    return RenderedPage(resize.data_url(resize.encode(page)), page.width, page.height, size)


def _inspect_pdf(source: Source, selection: PageSelection | None, max_pages: int) -> list[int]:
    document = _open_pdf(source.path)
    try:
        pages = resolve(selection, len(document), max_pages)
        for index in pages:
            _check_pixels(source, index, *_pdf_pixels(source, document, index))
        return pages
    finally:
        document.close()


def _open_pdf(path: str) -> pdfium.PdfDocument:
    """The PDF, opened through PDFium's own call: pypdfium2's `PdfDocument(path)` refuses a
    document with no pages by PDFium's last error, which a load that succeeded never set, so a
    0-page PDF was reported as whatever the worker's previous file had failed with
    (`encrypted_pdf` after an encrypted one). Here the error is read only when the load failed,
    and a document that loads with no page is `empty_pdf`."""
    name = os.fsencode(path) + b"\0"
    handle = pdfium_raw.FPDF_LoadDocument(name, None)
    if not handle:  # the load failed: FPDF_GetLastError is this load's
        code = pdfium_raw.FPDF_GetLastError()
        if code == pdfium_raw.FPDF_ERR_PASSWORD:
            raise DocumentError(
                "the PDF is encrypted with a password; remove the password and send it again",
                "encrypted_pdf",
            )
        why = PDFIUM_ERRORS.get(code, f"PDFium error {code}")
        raise DocumentError(f"`file` is not a readable PDF ({why})", "corrupt_file")
    if pdfium_raw.FPDF_GetPageCount(handle) < 1:
        pdfium_raw.FPDF_CloseDocument(handle)
        raise DocumentError("the PDF has no pages; send a PDF with at least one page", "empty_pdf")
    return pdfium.PdfDocument(handle)


def _pdf_pixels(source: Source, document: pdfium.PdfDocument, index: int) -> tuple[int, int]:
    """The page's size in pixels at the requested dpi, from its box (nothing is rendered)."""
    width, height = document.get_page_size(index)
    scale = source.dpi / POINTS_PER_INCH
    return math.ceil(width * scale), math.ceil(height * scale)


def _open_image(source: Source) -> Image.Image:
    # Pillow's own bomb guard, at our limit (a warning past it, an error past twice it); the
    # global is put back so that nothing else in the process sees our limit.
    default_limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, source.max_page_pixels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's "corrupt EXIF" and such: nothing to act on
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            return Image.open(source.path, formats=IMAGE_FORMATS)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
            claimed = re.search(r"\((\d+) pixels\)", str(exc))
            raise _too_large(source, 0, int(claimed.group(1)) if claimed else None) from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise DocumentError(
                f"`file` looks like {source.kind.name} but cannot be read ({exc})", "corrupt_file"
            ) from None
        finally:
            Image.MAX_IMAGE_PIXELS = default_limit


@contextlib.contextmanager
def _quiet_decoder(source: Source, doing: str) -> Iterator[None]:
    """Pillow's warnings silenced, its decoding errors as a 400 saying what failed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        except (OSError, EOFError, SyntaxError, ValueError) as exc:
            raise DocumentError(
                f"cannot {doing} the {source.kind.name} file ({exc}); is the file complete?",
                "corrupt_file",
            ) from None


def _check_pixels(source: Source, index: int, width: int, height: int) -> None:
    """The page's pixels and shape against the rules every route shares (app/documents/resize):
    refused here, from its header or page box, before anything is decoded or sent."""
    if width * height > source.max_page_pixels:
        raise _too_large(source, index, width * height, f" ({width}x{height})")
    resize.check_shape(f"page {index + 1}", width, height)


def _too_large(source: Source, index: int, pixels: int | None, size: str = "") -> DocumentError:
    shown = f"{pixels:,} pixels{size}" if pixels else "too many pixels"
    at_dpi = f" at {source.dpi} dpi" if source.kind.is_pdf else ""
    hint = "send a lower `dpi`" if source.kind.is_pdf else "scale it down before sending"
    return resize.too_large(f"page {index + 1}", shown + at_dpi, source.max_page_pixels, hint)
