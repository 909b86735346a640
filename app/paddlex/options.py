"""A `/layout-parsing` request's options as the gateway's own: layout, sampling, pixels, file.

PaddleX's names stop here: what follows is the document pipeline's `LayoutOptions`, the block
requests' sampling fields, and the pixel bounds of `Source`. The layout model's overrides go to
the layout service; a per-class dictionary keeps the keys that are class ids (PaddleX's own
server looks JSON's string keys up as integers and so applies none of them; here they apply).

`vlmExtraArgs` is read as PaddleX's pipeline reads it (`get_layout_parsing_results`, then its
server client `DocVLMGenAIClientPredictor`): `temperature`, `top_p`, `repetition_penalty`,
`max_new_tokens`, `min_pixels` and `max_pixels` over the request's own fields, and the pixel
bounds of one prompt (`ocr_min_pixels`, `table_max_pixels`, …); `use_cache` is the pipeline's
own and changes nothing. Every other key is one PaddleX's client would drop unsent: refused,
naming it, never dropped silently.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from app.documents import upload
from app.documents.layout_options import DEFAULT_IGNORE, LayoutOptions
from app.documents.sniff import FileKind
from app.errors import InvalidRequest, clip
from app.paddlex.schema import InferRequest
from app.settings import Settings

FILE_TYPES = {0: "a PDF", 1: "an image"}
PIXEL_KINDS = ("ocr", "table", "chart", "formula", "seal")  # get_layout_parsing_results
SPOTTING_PIXELS = (112_896, 1_605_632)  # a spotting block's bounds, fixed in PaddleX
EXTRA_FIELDS = {  # vlmExtraArgs key -> the request's field it stands for
    "temperature": "temperature", "top_p": "topP", "repetition_penalty": "repetitionPenalty",
    "max_new_tokens": "maxNewTokens", "min_pixels": "minPixels", "max_pixels": "maxPixels",
}  # fmt: skip
EXTRA_IGNORED = ("use_cache",)  # PaddleX's pipeline sets it itself; its server client drops it


@dataclass(frozen=True, slots=True)
class Extras:
    """`vlmExtraArgs`, checked: the request with its fields over the request's own, and the
    pixel bounds by prompt that it names ({kind: (min or None, max or None)})."""

    request: InferRequest
    pixels: dict[str, tuple[int | None, int | None]]


def extras(request: InferRequest) -> Extras:
    """`vlmExtraArgs` applied (422 naming `vlmExtraArgs.KEY` for a key PaddleX's client would
    not send or a value of the wrong type)."""
    given = request.vlmExtraArgs or {}
    update: dict[str, Any] = {}
    pixels: dict[str, tuple[int | None, int | None]] = {}
    for key, value in given.items():
        name = f"vlmExtraArgs.{clip(str(key))}"
        if key in EXTRA_IGNORED:
            continue
        if key in EXTRA_FIELDS:
            update[EXTRA_FIELDS[key]] = _extra_value(key, value, name)
            continue
        kind, _, bound = str(key).partition("_")
        if kind not in PIXEL_KINDS or bound not in ("min_pixels", "max_pixels"):
            raise InvalidRequest(
                f"`{name}` is not an argument PaddleX's pipeline passes to the model; send "
                f"{', '.join(EXTRA_FIELDS)}, KIND_min_pixels or KIND_max_pixels (KIND: "
                f"{', '.join(PIXEL_KINDS)})",
                param=name,
                code="unsupported_parameter",
            )
        low, high = pixels.get(kind, (None, None))
        count = _positive(value, name)
        pixels[kind] = (count, high) if bound == "min_pixels" else (low, count)
    merged = request.model_copy(update=update) if update else request
    low, high = merged.minPixels, merged.maxPixels
    if low is not None and high is not None and low > high:
        raise InvalidRequest(
            f"`vlmExtraArgs`: min_pixels ({low}) cannot be greater than max_pixels ({high})",
            param="vlmExtraArgs",
            code="invalid_value",
        )
    return Extras(merged, pixels)


def _extra_value(key: str, value: Any, name: str) -> float | int:
    """A sampling field's value held to the rules of the request's own field."""
    if key in ("max_new_tokens", "min_pixels", "max_pixels"):
        return _positive(value, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(
            f"`{name}` must be a number; got {type(value).__name__}",
            param=name,
            code="invalid_value",
        )
    wrong = {
        "temperature": value < 0,
        "top_p": not 0 < value <= 1,
        "repetition_penalty": value <= 0,
    }[key]
    if wrong:
        rule = {"temperature": "≥ 0", "top_p": "> 0 and ≤ 1", "repetition_penalty": "> 0"}[key]
        raise InvalidRequest(
            f"`{name}` must be {rule}; got: {value}", param=name, code="invalid_value"
        )
    return value


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(
            f"`{name}` must be an integer above 0; got {clip(repr(value))}",
            param=name,
            code="invalid_value",
        )
    return value


def kind_pixels(extra: Extras, settings: Settings) -> dict[str, list[int]] | None:
    """The pixel bounds by prompt kind, the document's filling what a kind leaves out, held to
    OCRVL_MAX_PIXELS (None when `vlmExtraArgs` names none)."""
    if not extra.pixels:
        return None
    low, high = pixels(extra.request, settings)
    bounded = {}
    for kind, (given_low, given_high) in extra.pixels.items():
        most = min(given_high or high, settings.max_pixels)
        bounded[kind] = [min(given_low or low, most), most]
    return bounded


def page_pixels(extra: Extras, settings: Settings, label: str) -> tuple[int, int]:
    """(min, max) pixels of a page read whole with `label`'s prompt (no layout detection): its
    kind's bounds, a spotting page PaddleX's fixed ones (held to OCRVL_MAX_PIXELS too)."""
    if label == "spotting":
        most = min(SPOTTING_PIXELS[1], settings.max_pixels)
        return min(SPOTTING_PIXELS[0], most), most
    bounded = kind_pixels(extra, settings) or {}
    chosen = bounded.get(label)
    return (chosen[0], chosen[1]) if chosen else pixels(extra.request, settings)


def layout_options(
    request: InferRequest, kinds: dict[str, list[int]] | None = None
) -> LayoutOptions | None:
    """The document pipeline's options (`kinds`: the pixel bounds by prompt), or None when
    layout detection is off (each page is then read whole with `promptLabel`'s prompt)."""
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
        ocr_images=bool(request.useOcrForImageBlock),
        pixels=kinds,
        orientation=preprocessing(request)[0],
        unwarp=preprocessing(request)[1],
    )


def preprocessing(request: InferRequest) -> tuple[bool, bool]:
    """(orientation, unwarping) as PaddleX's pipeline runs them: neither unless one is asked
    for, and then each unless it is sent false (its DocPreprocessor's own defaults are on: a
    request with `useDocOrientationClassify` alone is also unwarped)."""
    asked = (request.useDocOrientationClassify, request.useDocUnwarping)
    if True not in asked:
        return False, False
    return asked[0] is not False, asked[1] is not False


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
