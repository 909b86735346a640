"""A `/layout-parsing` request's options as the gateway's own: layout, sampling, pixels, file.

PaddleX's names stop here: what follows is the document pipeline's `LayoutOptions`, the block
requests' sampling fields, and the pixel bounds of `Source`. The layout model's overrides go to
the layout service; a per-class dictionary keeps the keys that are class ids (PaddleX's own
server looks JSON's string keys up as integers and so applies none of them; here they apply).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from app.documents import upload
from app.documents.layout_options import DEFAULT_IGNORE, LayoutOptions
from app.documents.sniff import FileKind
from app.errors import InvalidRequest
from app.paddlex.schema import InferRequest
from app.settings import Settings

FILE_TYPES = {0: "a PDF", 1: "an image"}


def layout_options(request: InferRequest) -> LayoutOptions | None:
    """The document pipeline's options, or None when layout detection is off (each page is
    then read whole with `promptLabel`'s prompt)."""
    if request.useLayoutDetection is False:
        return None
    ignored = request.markdownIgnoreLabels
    return LayoutOptions(
        threshold=_per_class(request.layoutThreshold),
        nms=request.layoutNms,
        unclip_ratio=_per_class(request.layoutUnclipRatio),
        merge_bboxes_mode=_per_class(request.layoutMergeBboxesMode),
        shape_mode=request.layoutShapeMode,
        ignore_labels=DEFAULT_IGNORE if ignored is None else tuple(ignored),
        chart=bool(request.useChartRecognition),
        seal=bool(request.useSealRecognition),
        merge_blocks=request.mergeLayoutBlocks is not False,
        pretty=request.prettifyMarkdown,
        formula_number=request.showFormulaNumber,
        images=request.returnMarkdownImages,
    )


def _per_class(value: Any) -> Any:
    """A float, pair or mode as it is; a dictionary by class id (other keys left out)."""
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, dict):
        return value
    return {str(int(key)): item for key, item in value.items() if str(key).strip().isdigit()}


def sampling(request: InferRequest) -> dict[str, float]:
    """The sampling fields every block request carries (PaddleX's client sends these three)."""
    fields = {
        "temperature": request.temperature,
        "top_p": request.topP,
        "repetition_penalty": request.repetitionPenalty,
    }
    return {name: value for name, value in fields.items() if value is not None}


def pixels(request: InferRequest, settings: Settings) -> tuple[int, int]:
    """(min, max) pixels of a block for the model: the request's, held to OCRVL_MAX_PIXELS
    as a chat request's `mm_processor_kwargs` are."""
    most = min(request.maxPixels or settings.max_pixels, settings.max_pixels)
    return min(request.minPixels or settings.ocr_min_pixels, most), most


def file_bytes(file: str) -> bytes:
    """`file` as base64 (PaddleX's lenient `b64decode`: line breaks and stray characters are
    skipped); a `data:` URL's payload too."""
    upload.refuse_scheme(file)
    if file.startswith("data:") and "," in file:
        file = file.partition(",")[2]
    try:
        data = base64.b64decode(file)
    except (binascii.Error, ValueError):
        data = b""
    if not data and file.strip():  # nothing but characters the lenient decoder skips
        raise InvalidRequest(
            "`file` is neither valid base64 nor an http(s) URL", param="file", code="invalid_value"
        )
    return data


def check_type(file_type: int | None, kind: FileKind) -> None:
    """`fileType` against what the file is (None: the file says)."""
    if file_type is None or (file_type == 0) == kind.is_pdf:
        return
    raise InvalidRequest(
        f"`fileType` is {file_type} ({FILE_TYPES[file_type]}) but the file is "
        f"{'a PDF' if kind.is_pdf else f'a {kind.name} image'}; send 0 for a PDF, 1 for an image "
        "or null to let the server tell",
        param="fileType",
        code="invalid_value",
    )
