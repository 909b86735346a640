"""PaddleX's answer built from the gateway's pages: `layoutParsingResults`, `dataInfo`.

    settings_of(request, layout)   the `model_settings` PaddleX's pipeline would report
    page_of(result, size, …)       one read page (app/documents' PageResult) as a PaddleX page
    written(pages, writing)        each page's `prunedResult` and markdown text, after the
                                   restructuring asked for (runs in a page worker)
    failure_of(result)             the error that fails the whole request, as PaddleX fails it

Mirrors the serving app (`basic_serving/_pipeline_apps/paddleocr_vl.py`, PaddleX 3.7): the
result's JSON pruned of `input_path` and `page_index`, `_to_markdown(pretty,
show_formula_number)`; a page read without layout detection is one block of `promptLabel`
covering the page, as PaddleX's pipeline makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.documents import answers
from app.documents.layout_options import DEFAULT_IGNORE, LayoutOptions
from app.errors import GatewayError, UpstreamError
from app.paddlex.markdown import formatted, render
from app.paddlex.restructure import Block, Page, pruned, restructure

if TYPE_CHECKING:
    from app.documents.blocks import Box
    from app.documents.job import PageResult
    from app.paddlex.schema import InferRequest


@dataclass(frozen=True, slots=True)
class Writing:
    """How pages are written: the request's markdown and restructuring options."""

    pretty: bool = True
    formula_number: bool = False
    restructure: bool = False
    merge_tables: bool = True
    relevel_titles: bool = True
    concatenate: bool = False


def settings_of(request: InferRequest, layout: LayoutOptions | None) -> dict[str, Any]:
    """`get_model_settings` for the request (and `return_layout_polygon_points`)."""
    label = request.promptLabel or "ocr"
    chart = layout.chart if layout is not None else label == "chart"
    seal = layout.seal if layout is not None else label == "seal"
    ignored = request.markdownIgnoreLabels
    return {
        "use_doc_preprocessor": layout is not None and layout.preprocessing,
        "use_layout_detection": layout is not None,
        "use_chart_recognition": chart or bool(request.useChartRecognition),
        "use_seal_recognition": seal or bool(request.useSealRecognition),
        "use_ocr_for_image_block": bool(request.useOcrForImageBlock),
        "format_block_content": bool(request.formatBlockContent),
        "merge_layout_blocks": request.mergeLayoutBlocks is not False,
        "markdown_ignore_labels": list(DEFAULT_IGNORE if ignored is None else ignored),
        "return_layout_polygon_points": request.layoutShapeMode != "rect",
    }


def page_of(
    result: PageResult,
    size: tuple[int, int],
    settings: dict[str, Any],
    label: str,
    steps: dict[str, bool] | None = None,
) -> Page:
    """The read page as PaddleX's page result: its blocks (with a layout) or one block of
    `label` over the whole page (without), its size and its layout boxes; `steps`: the document
    preprocessing's `model_settings` (`doc_preprocessor_res`, its `angle` -1 when unclassified)."""
    width, height = result.size or size  # the corrected page's, when the service changed it
    page: dict[str, Any] = {"page_count": None, "width": width, "height": height}
    page["model_settings"] = settings
    if settings["use_doc_preprocessor"]:
        page["doc_preprocessor_res"] = {
            "model_settings": steps,
            "angle": -1 if result.angle is None else result.angle,
        }
    if not settings["use_layout_detection"]:
        if result.spotting is not None:  # read, loops cut, by the page's own reader (fanout)
            page["spotting_res"] = {
                "rec_polys": [spot["polygon"] for spot in result.spotting],
                "rec_texts": [spot["text"] for spot in result.spotting],
            }
            return Page(page, [Block(label, [0, 0, width, height], result.text or "")])
        content = answers.content(label, result.text)
        return Page(page, [Block(label, [0, 0, width, height], content, loop=result.loop)])
    page["layout_det_res"] = {"boxes": [box_json(box) for box in result.boxes or []]}
    blocks = [
        Block(e["label"], e["bbox"], e["text"], e["group"], e.get("polygon"), e.get("image"))
        for e in result.blocks or []
    ]
    for block, entry in zip(blocks, result.blocks or [], strict=True):
        block.loop = entry.get("loop")
    return Page(page, blocks)


def box_json(box: Box) -> dict[str, Any]:
    """A layout box as PaddleX's layout model leaves it (`layout_det_res.boxes[]`)."""
    shown: dict[str, Any] = {
        "cls_id": box.cls_id,
        "label": box.label,
        "score": box.score,
        "coordinate": [int(v) if float(v).is_integer() else v for v in box.coordinate],
        "order": box.order,
    }
    if box.polygon is not None:
        shown["polygon_points"] = [[x, y] for x, y in box.polygon]
    return shown


def written(pages: list[Page], writing: Writing) -> list[dict[str, Any]]:
    """Each page's `prunedResult` and `markdown.text` (one page once concatenated)."""
    if writing.restructure:
        pages = restructure(
            pages, merge_tables=writing.merge_tables, relevel_titles=writing.relevel_titles,
            concatenate=writing.concatenate,
        )  # fmt: skip
    out = []
    for page in pages:
        shown = formatted(page) if page.settings.get("format_block_content") else None
        text = render(page, pretty=writing.pretty, formula_number=writing.formula_number)
        out.append({"prunedResult": pruned(page, shown), "markdown": {"text": text}})
    return out


def failure_of(result: PageResult) -> GatewayError | None:
    """The page's error, or its first failed block's: PaddleX answers a document whole or not
    at all, so one failure fails the request."""
    if result.error is not None:
        return result.error
    for block in result.blocks or []:
        error = block.get("error")
        if error is not None:
            message = f"page {result.index}, block {block['index']} ({block['label']}) failed: "
            return UpstreamError(message + str(error.get("message")), code=error.get("code"))
    return None
