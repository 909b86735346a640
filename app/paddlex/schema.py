"""PaddleX's request bodies for the PaddleOCR-VL pipeline, field for field, and what they ask.

`InferRequest` and `RestructurePagesRequest` copy PaddleX 3.7's pydantic models
(`paddlex/inference/serving/schemas/paddleocr_vl.py`, `schemas/shared/ocr.py`, `export.py`):
the same names, types, defaults and validators, so a body PaddleX's server takes is taken here
and one it refuses is refused (422, naming the field). Unknown fields are ignored, as PaddleX
ignores them. `refused` then names the options PaddleX has and this server does not run: they
are refused, never silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator

from app.errors import InvalidRequest, clip

PROMPT_LABELS = ("ocr", "formula", "table", "chart", "seal", "spotting")
MERGE_MODES = ("large", "small", "union")
Positive = Annotated[int, Field(gt=0)]
Model = TypeVar("Model", bound=BaseModel)


class _Exports(BaseModel):
    """`OutputFormatsMixin`: extra formats (docx) PaddleX can export."""

    outputFormats: list[str] | None = None

    @field_validator("outputFormats")
    @classmethod
    def _formats(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if name != "docx":
                raise ValueError(
                    f"Unsupported `outputFormats` entry {name!r}. Supported values: ['docx']"
                )
        return value


class InferRequest(_Exports):
    """`POST /layout-parsing`'s body (PaddleX's `InferRequest`)."""

    file: str
    fileType: Literal[0, 1] | None = None
    useDocOrientationClassify: bool | None = None
    useDocUnwarping: bool | None = None
    useLayoutDetection: bool | None = None
    useChartRecognition: bool | None = None
    useSealRecognition: bool | None = None
    useOcrForImageBlock: bool | None = None
    layoutThreshold: float | dict[Any, Any] | None = None
    layoutNms: bool | None = None
    layoutUnclipRatio: float | tuple[float, float] | dict[Any, Any] | None = None
    layoutMergeBboxesMode: str | dict[Any, Any] | None = None
    layoutShapeMode: Literal["rect", "quad", "poly", "auto"] = "auto"
    promptLabel: str | None = None
    formatBlockContent: bool | None = None
    repetitionPenalty: float | None = None
    temperature: float | None = None
    topP: float | None = None
    minPixels: Positive | None = None
    maxPixels: Positive | None = None
    maxNewTokens: Positive | None = None
    mergeLayoutBlocks: bool | None = None
    markdownIgnoreLabels: list[str] | None = None
    vlmExtraArgs: dict[Any, Any] | None = None
    prettifyMarkdown: bool = True
    showFormulaNumber: bool = False
    returnMarkdownImages: bool = True
    restructurePages: bool = False
    mergeTables: bool = True
    relevelTitles: bool = True
    visualize: bool | None = None
    logId: str | None = None
    loops: Literal["cut", "retry", "off"] | None = None  # the gateway's loop guard (docs/loops.md)

    @field_validator("topP")
    @classmethod
    def _top_p(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"`topP` must be > 0 and ≤ 1; got: {value}")
        return value

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"`temperature` must be ≥ 0; got: {value}")
        return value

    @field_validator("repetitionPenalty")
    @classmethod
    def _repetition(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"`repetitionPenalty` must be > 0; got: {value}")
        return value

    @field_validator("promptLabel")
    @classmethod
    def _prompt(cls, value: str | None) -> str | None:
        if value is not None and value not in PROMPT_LABELS:
            raise ValueError(
                f"`promptLabel` must be one of: {', '.join(PROMPT_LABELS)}; got: {value}"
            )
        return value

    @field_validator("layoutMergeBboxesMode")
    @classmethod
    def _merge(cls, value: str | dict[Any, Any] | None) -> str | dict[Any, Any] | None:
        if isinstance(value, str) and value not in MERGE_MODES:
            raise ValueError(
                f"`layoutMergeBboxesMode` must be one of: {', '.join(MERGE_MODES)}; got: {value}"
            )
        for mode in value.values() if isinstance(value, dict) else ():
            if not isinstance(mode, str):  # pydantic turns only ValueError into a 422
                raise ValueError(  # noqa: TRY004
                    "`layoutMergeBboxesMode` dictionary values must be strings; "
                    f"got: {type(mode).__name__}"
                )
            if mode not in MERGE_MODES:
                raise ValueError(
                    "`layoutMergeBboxesMode` dictionary value must be one of: "
                    f"{', '.join(MERGE_MODES)}; got: {clip(mode)}"
                )
        return value

    @field_validator("layoutUnclipRatio")
    @classmethod
    def _unclip(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for key, ratio in value.items():
                _ratio(ratio, f" value for key '{clip(str(key))}'")
        elif value is not None:
            _ratio(value, "")  # a pair arrives here as a tuple, which PaddleX refuses too
        return value

    @field_validator("layoutThreshold")
    @classmethod
    def _threshold(cls, value: Any) -> Any:
        if value is None:
            return value
        for key, threshold in value.items() if isinstance(value, dict) else [(None, value)]:
            where = "" if key is None else f" value for key '{clip(str(key))}'"
            if not _number(threshold):
                raise ValueError(
                    f"`layoutThreshold`{where} must be a number; got: {type(threshold).__name__}"
                )
            if threshold < 0 or threshold > 1:
                raise ValueError(
                    f"`layoutThreshold`{where} must be between 0 and 1 inclusive; got: {threshold}"
                )
        return value

    @field_validator("maxPixels")
    @classmethod
    def _pixels(cls, high: int | None, info: ValidationInfo) -> int | None:
        low = info.data.get("minPixels")
        if low is not None and high is not None and low > high:
            raise ValueError(f"`minPixels` ({low}) cannot be greater than `maxPixels` ({high})")
        return high


class Page(BaseModel):
    """One page a client sends back to `/restructure-pages`."""

    prunedResult: dict[str, Any]
    markdownImages: dict[str, str] | None = None


class RestructurePagesRequest(_Exports):
    """`POST /restructure-pages`'s body (PaddleX's `RestructurePagesRequest`)."""

    pages: list[Page]
    mergeTables: bool = True
    relevelTitles: bool = True
    concatenatePages: bool = False
    prettifyMarkdown: bool = True
    showFormulaNumber: bool = False
    returnMarkdownImages: bool = True
    logId: str | None = None


def _number(value: Any) -> bool:
    return isinstance(value, int | float)  # PaddleX's isinstance check: True passes as 1


def _ratio(value: Any, where: str) -> None:
    """PaddleX's `_validate_ratio_value`: a number > 0, or a list of two (never a tuple)."""
    if _number(value):
        if value <= 0:
            raise ValueError(f"`layoutUnclipRatio`{where} must be > 0; got: {value}")
    elif isinstance(value, list):
        if len(value) != 2:
            raise ValueError(
                f"`layoutUnclipRatio`{where} must be two numbers; got: {len(value)} values"
            )
        for i, item in enumerate(value):
            if not _number(item):
                raise ValueError(
                    f"`layoutUnclipRatio`{where} values must be numbers; got: "
                    f"{type(item).__name__} at position {i}"
                )
            if item <= 0:
                raise ValueError(
                    f"`layoutUnclipRatio`{where} values must be > 0; got: {item} at position {i}"
                )
    else:
        raise ValueError(
            f"`layoutUnclipRatio`{where} must be a number or two numbers; "
            f"got: {type(value).__name__}"
        )


def parse(model: type[Model], body: Any) -> Model:
    """`body` as `model`; a 400 (422 on these routes) naming the first field it fails on."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_value")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _where(first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequest(
            f"`{where}`: {clip(message)}" if where else clip(message),
            param=where or None,
            code="missing_required_parameter" if first["type"] == "missing" else "invalid_value",
        ) from None


def _where(loc: tuple[int | str, ...]) -> str:
    """PaddleX's dotted field path (`pages[0].prunedResult`), the union's member names left out."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part[:1].islower() or part[:1] == "_" or not path:
            path += f".{part}" if path else part
    return clip(path)


# What PaddleX runs and this server runs only with layout detection (in the layout service).
PREPROCESSING = {
    "useDocOrientationClassify": "document orientation classification (PP-LCNet_x1_0_doc_ori)",
    "useDocUnwarping": "document unwarping (UVDoc)",
}


def refused(request: InferRequest) -> InvalidRequest | None:
    """The first option this server does not run, as the 422 to answer, or None."""
    for name, what in PREPROCESSING.items():
        if getattr(request, name) and request.useLayoutDetection is False:
            return _unsupported(
                name,
                f"this server runs {what} in its layout service, with layout detection only; "
                "send `useLayoutDetection` true (or null) or this option false",
            )
    if request.outputFormats:
        return _unsupported("outputFormats", "this server exports no other formats (docx)")
    return None


def refused_export(request: RestructurePagesRequest) -> InvalidRequest | None:
    """`outputFormats` on `/restructure-pages`, refused like `/layout-parsing`'s."""
    if request.outputFormats:
        return _unsupported("outputFormats", "this server exports no other formats (docx)")
    return None


def _unsupported(name: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"`{name}` is not supported: {why}", param=name, code="unsupported_parameter"
    )
