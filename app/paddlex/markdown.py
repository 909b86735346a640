"""A restructured page's markdown, as PaddleX writes it, through the gateway's own formatters.

`PaddleOCRVLResult._to_markdown` (PaddleX 3.7) over blocks that may have been merged or
re-levelled: the page pipeline's formatters (app/documents/markdown.py, one per label, built
from the page's `model_settings`), a re-levelled paragraph title as `#` times its level + 1
(`format_para_title`), a seal read as text when the page had no layout, formula numbers merged
into their formulas (`MarkdownConverter.convert`). `formatted` is the same per block, pretty,
for `formatBlockContent` (`_to_json` with `format_block_content`).
"""

from __future__ import annotations

from collections.abc import Callable

from app.documents.crops import PlannedBlock
from app.documents.layout_options import LayoutOptions
from app.documents.markdown import label_handlers
from app.paddlex.restructure import Block, Page

FORMULAS = ("display_formula", "formula")
NUMBER = "formula_number"
Piece = Callable[[Block, str], str | None]


def _collapse(text: str) -> str:
    return text.replace("-\n", "").replace("\n", " ")


def _pieces(page: Page, pretty: bool) -> Piece:
    """What one block (with the content to show) becomes; None for a label left out."""
    settings = page.settings
    options = LayoutOptions(
        chart=bool(settings.get("use_chart_recognition", False)),
        seal=bool(settings.get("use_seal_recognition", False)),
        pretty=pretty,
        ignore_labels=tuple(settings.get("markdown_ignore_labels", [])),
        ocr_images=bool(settings.get("use_ocr_for_image_block", False)),
    )
    handlers = label_handlers(options, page.width)
    if not settings.get("use_layout_detection", False) and "seal" in handlers:
        handlers["seal"] = lambda block, content: (
            f'<div style="text-align: center;">{_collapse(content)}</div>\n' if pretty else content
        )

    def piece(block: Block, content: str) -> str | None:
        handle = handlers.get(block.label)
        if handle is None:
            return None
        if block.label == "paragraph_title" and block.title_level is not None:
            return _collapse(f"#{'#' * block.title_level} {content}")
        bbox = [int(v) for v in block.bbox]
        return handle(PlannedBlock(block.label, bbox, 0.0, None, image_path=block.image), content)

    return piece


def render(page: Page, *, pretty: bool, formula_number: bool) -> str:
    """The page's markdown text."""
    piece = _pieces(page, pretty)
    blocks, text = page.blocks, ""
    for n, block in enumerate(blocks):
        content = block.content
        after = blocks[n + 1] if n + 1 < len(blocks) else None
        if formula_number and block.label in FORMULAS and after and after.label == NUMBER:
            content = f"$${content.replace('$$', '')} \\tag*{{{after.content}}}$$"
        shown = piece(block, content)
        if shown is not None:
            text = text + "\n\n" + shown if text else shown
    return text


def formatted(page: Page) -> list[str]:
    """Each block's content as `format_block_content` writes it (pretty; a label left out of
    the markdown keeps its content)."""
    piece = _pieces(page, pretty=True)
    return [
        shown if (shown := piece(block, block.content)) is not None else block.content
        for block in page.blocks
    ]
