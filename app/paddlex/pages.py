"""A document's pages as PaddleX's server describes and draws them; runs in the page workers.

    inspect(source, max_pages)     the pages to read (every one, under OCRVL_MAX_PAGES, after
                                   /v1/ocr's own checks) and their sizes: `dataInfo`
    visualize(source, index, ...)  `inputImage` (the page) and `outputImages.layout_det_res`
                                   (the page with its layout boxes drawn), base64 JPEGs

PaddleX renders a PDF page at scale 2 (144 dpi, the gateway's default) and decodes an image
upright (OpenCV applies the EXIF orientation), so a page's size here is the one its pipeline
reports. Its output images are JPEGs shrunk to fit 2000x2000 (`max_output_img_size`); the
boxes are drawn as its `draw_box` draws them (its colours, line and label), in Pillow's font.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pypdfium2 as pdfium
from PIL import Image, ImageDraw, ImageFont

from app.documents import raster
from app.documents.errors import DocumentError

MAX_OUTPUT_SIDE = 2000  # PaddleX's DEFAULT_MAX_OUTPUT_IMG_SIZE
COLORS = (
    (255, 0, 0), (204, 255, 0), (0, 255, 102), (0, 102, 255), (204, 0, 255), (255, 77, 0),
    (128, 255, 0), (0, 255, 178), (0, 26, 255), (255, 0, 229), (255, 153, 0), (51, 255, 0),
    (0, 255, 255), (51, 0, 255), (255, 0, 153), (255, 229, 0), (0, 255, 26), (0, 178, 255),
    (128, 0, 255), (255, 0, 77),
)  # fmt: skip  # paddlex/inference/utils/color_map.get_colormap(rgb=True)
LIGHT = {0, 3, 4, 8, 9, 13, 14, 18, 19}  # font_colormap: white text on these, dark on others
EXIF_ORIENTATION = 0x0112
TURNED = {5, 6, 7, 8}  # orientations whose upright page swaps width and height


@dataclass(frozen=True, slots=True)
class Pages:
    """What `dataInfo` says of the file, and the pages to read."""

    kind: str  # "image", "pdf" or "tiff" (a TIFF of several frames), as PaddleX names them
    indexes: list[int]  # 0-based
    sizes: list[tuple[int, int]]  # (width, height) of each, upright, in the pipeline's pixels

    def data_info(self) -> dict[str, Any]:
        """PaddleX's `ImageInfo`, `PDFInfo` or `TIFFInfo`."""
        if self.kind == "image":
            width, height = self.sizes[0]
            return {"width": width, "height": height, "type": "image"}
        pages = [{"width": width, "height": height} for width, height in self.sizes]
        return {"numPages": len(pages), "pages": pages, "type": self.kind}


def inspect(source: raster.Source, max_pages: int) -> Pages:
    """Every page of the file (OCRVL_MAX_PAGES at most: a DocumentError past it, as for
    /v1/ocr), checked as /v1/ocr checks them, with its size."""
    try:
        indexes = raster.inspect(source, None, max_pages)
    except DocumentError as exc:
        if exc.code != "too_many_pages":
            raise
        raise DocumentError(  # this route reads every page: it has no `pages` to choose some
            f"the file has more than {max_pages} pages, the most one request may read "
            "(OCRVL_MAX_PAGES): split it into parts of at most that many pages, or send it to "
            "/v1/ocr, whose `pages` field reads some of them",
            "too_many_pages",
        ) from None
    if source.kind.is_pdf:
        document = pdfium.PdfDocument(source.path)
        try:
            scale = source.dpi / raster.POINTS_PER_INCH
            sizes = [_scaled(document.get_page_size(i), scale) for i in indexes]
        finally:
            document.close()
        return Pages("pdf", indexes, sizes)
    with _opened(source.path) as image:
        sizes = []
        for index in indexes:
            image.seek(index)
            turned = image.getexif().get(EXIF_ORIENTATION) in TURNED
            sizes.append((image.height, image.width) if turned else (image.width, image.height))
        frames = getattr(image, "n_frames", 1)
    return Pages("tiff" if frames > 1 else "image", indexes, sizes)


@contextlib.contextmanager
def _opened(path: str) -> Iterator[Image.Image]:
    """The image, its header read (raster.inspect has checked its pixels against
    OCRVL_MAX_PAGE_PIXELS already, so Pillow's own, lower bomb guard stands aside)."""
    default, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = Image.open(path, formats=raster.IMAGE_FORMATS)
    finally:
        Image.MAX_IMAGE_PIXELS = default
    with image:
        yield image


def _scaled(size: tuple[float, float], scale: float) -> tuple[int, int]:
    return math.ceil(size[0] * scale), math.ceil(size[1] * scale)


@dataclass(frozen=True, slots=True)
class Corrected:
    """The page the layout service turned or flattened, and what `doc_preprocessor_res` says."""

    image: str  # data URL
    angle: int
    orientation: bool
    unwarping: bool

    @classmethod
    def of(cls, result: Any, steps: dict[str, Any] | None) -> Corrected | None:
        """From a read page (PageResult) and its `doc_preprocessor_res` (None: no steps)."""
        if steps is None:
            return None
        settings = steps["model_settings"]
        image = result.corrected
        return cls(
            image or "", steps["angle"], settings["use_doc_orientation_classify"],
            settings["use_doc_unwarping"],
        )  # fmt: skip


def visualize(
    source: raster.Source,
    index: int,
    boxes: list[dict[str, Any]] | None,
    corrected: Corrected | None = None,
) -> tuple[str, dict[str, str]]:
    """(`inputImage`, `outputImages`) of page `index`: its layout drawn on the page it was found
    on (`layout_det_res`, with a layout) and the preprocessing (`preprocessed_img`)."""
    page = raster.page_image(source, index)
    shown: dict[str, str] = {}
    found_on = page
    if corrected is not None:
        found_on = _decoded(corrected.image) if corrected.image else page
        shown["preprocessed_img"] = _jpeg(_preprocessed(page, found_on, corrected))
    if boxes is not None:
        shown["layout_det_res"] = _jpeg(draw_boxes(found_on.copy(), boxes))
    return _jpeg(page), shown


def _decoded(url: str) -> Image.Image:
    with Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2]))) as image:
        return image.convert("RGB")


def _preprocessed(page: Image.Image, out: Image.Image, corrected: Corrected) -> Image.Image:
    """DocPreprocessorResult._to_img: the page, turned, flattened side by side over a 25 px
    band of captions (the turned page is the service's output: it sends no middle step)."""
    turned = out
    if corrected.unwarping and corrected.angle > 0:
        turned = page.rotate(corrected.angle, expand=True)  # exact at right angles
    elif corrected.unwarping:
        turned = page
    height = max(page.height, turned.height, out.height)
    shown = Image.new("RGB", (page.width + turned.width + out.width, height + 25), "white")
    left = 0
    captions = (
        "Original Image",
        f"Rotated Image ({corrected.orientation}, {corrected.angle})",
        f"Unwarping Image ({corrected.unwarping})",
    )
    draw = ImageDraw.Draw(shown)
    font = ImageFont.load_default(size=16)
    for image, caption in zip((page, turned, out), captions, strict=True):
        shown.paste(image, (left, 0))
        draw.text((10 + left, height + 2), caption, fill=(0, 0, 0), font=font)
        left += image.width
    return shown


def draw_boxes(image: Image.Image, boxes: list[dict[str, Any]]) -> Image.Image:
    """`paddlex/inference/models/layout_analysis/result.draw_box`: each box outlined in its
    label's colour, `label score` on a filled tab above it, its number in red at its right."""
    font_size = int(0.018 * image.width) + 2
    font = ImageFont.load_default(size=font_size)
    thickness = int(max(image.size) * 0.002)
    draw = ImageDraw.Draw(image)
    colors: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {}
    for i, box in enumerate(boxes):
        label = str(box["label"])
        if label not in colors:
            n = i % len(COLORS)
            colors[label] = (COLORS[n], (255, 255, 255) if n in LIGHT else (20, 14, 53))
        color, text_color = colors[label]
        x1, y1, x2, y2 = (float(v) for v in box["coordinate"])
        outline = [(x1, y1), (x1, y2), (x2, y2), (x2, y1), (x1, y1)]
        draw.line(outline, width=thickness, fill=color)
        text = f"{label} {float(box['score']):.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font)
        width, height = right - left, bottom - top + 4
        tab_top = y1 if y1 < height else y1 - height
        draw.rectangle([(x1, tab_top), (x1 + width + 4, tab_top + height + 1)], fill=color)
        draw.text((x1 + 2, tab_top - 2), text, fill=text_color, font=font)
        number = (x2 + 2, y1 - font_size // 2)
        if image.width - x2 < font_size:
            number = (int(x2 - font_size * 1.1), y1 - font_size // 2)
        draw.text(number, str(i + 1), font=font, fill="red")
    return image


def _jpeg(image: Image.Image) -> str:
    """Base64 of the image as a JPEG, shrunk to fit MAX_OUTPUT_SIDE as PaddleX shrinks it."""
    width, height = image.size
    if width > MAX_OUTPUT_SIDE or height > MAX_OUTPUT_SIDE:
        factor = MAX_OUTPUT_SIDE / (width if width >= height else height)
        image = image.resize((int(factor * width), int(factor * height)), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=95)  # OpenCV's imencode default
    return base64.b64encode(out.getvalue()).decode("ascii")
