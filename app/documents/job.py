"""A document's work and its answers: what to read (OcrJob) and each page's result (PageResult).

Below both drivers of a page (fanout reads it whole, parsing block by block), so each imports
these names without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.documents.blocks import Box
from app.documents.layout_options import LayoutOptions
from app.documents.raster import Source
from app.errors import GatewayError

NO_BLOCKS = "no_blocks"  # a page's `empty`: the layout found no block on it, nothing was read

# The model's own task prompts (PaddleOCR-VL's model card and PaddleX's pipeline).
PROMPTS = {
    "ocr": "OCR:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
    "chart": "Chart Recognition:",
    "spotting": "Spotting:",
    "seal": "Seal Recognition:",
}


@dataclass(frozen=True, slots=True)
class OcrJob:
    """What to read and how to ask for it."""

    source: Source
    pages: list[int]  # 0-based
    task: str
    model: str  # the served name
    max_tokens: int | None
    page_images: bool = False  # each PageResult carries the page's JPEG data URL (`image`)
    layout: LayoutOptions | None = None  # read block by block (None: each page whole)
    model_len: int | None = None  # the served model's context length, if it says
    # sampling fields every request of the document carries (temperature, top_p,
    # repetition_penalty: PaddleX's `/layout-parsing`); empty: temperature 0 as PaddleX's client
    sampling: dict[str, float] = field(default_factory=dict)
    loops: str = "cut"  # the loop guard: cut, retry or off (app/documents/streams.py)


@dataclass(slots=True)
class PageResult:
    """One page's answer, or its error."""

    index: int  # 1-based page number, as in `pages`
    text: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    html: str | None = None
    error: GatewayError | None = field(default=None, repr=False)
    image: str | None = field(default=None, repr=False)  # the page the model read (data URL)
    markdown: str | None = None  # with a layout: the page's markdown (also its `text`)
    blocks: list[dict[str, Any]] | None = field(default=None, repr=False)  # with a layout
    images: dict[str, str] | None = field(default=None, repr=False)  # markdown path -> data URL
    boxes: list[Box] | None = field(default=None, repr=False)  # with a layout: the service's
    cached: bool = False  # answered from the results cache (app/documents/cache.py)
    empty: str | None = None  # with a layout, why the page has no text: NO_BLOCKS
    spotting: list[dict[str, Any]] | None = field(default=None, repr=False)  # task spotting
    angle: int | None = None  # with `orientation`: the page was turned counter-clockwise by it
    corrected: str | None = field(default=None, repr=False)  # the page turned or flattened
    size: tuple[int, int] | None = field(default=None, repr=False)  # the page the boxes are on
    stopped: str | None = None  # whole page: "repetition" when the loop guard stopped it
    loop: dict[str, Any] | None = None  # and how: {"unit", "tokens"[, "retry"]}

    def as_dict(self) -> dict[str, Any]:
        """The page as the API shows it (`error` in OpenAI's shape, only when it failed)."""
        shown: dict[str, Any] = {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
        }
        for name in (
            "image",
            "html",
            "markdown",
            "blocks",
            "images",
            "empty",
            "spotting",
            "angle",
            "stopped",
            "loop",
        ):  # only those it has
            if (value := getattr(self, name)) is not None:
                shown[name] = value
        if self.cached:
            shown["cached"] = True
        if self.error is not None:
            shown["error"] = self.error.body()["error"]
        return shown
