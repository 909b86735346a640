"""Pages restructured as PaddleX's `restructure_pages` does it, and pages written as its JSON.

    Block, Page                 a page's blocks and the rest of its result (PaddleX's
                                `PaddleOCRVLBlock` and result dict)
    restructure(pages, …)       tables merged across pages, titles re-levelled, pages
                                concatenated into one (`_PaddleOCRVLPipeline.restructure_pages`)
    pruned(page)                the page as `prunedResult` (`PaddleOCRVLResult._to_json`, then
                                the serving app's `prune_result`)

Mirrors PaddleX 3.7 `paddlex/inference/pipelines/paddleocr_vl/pipeline.py` and `result.py`,
`layout_parsing/merge_table.py` (app/paddlex/tables.py) and `title_level.py`
(app/paddlex/titles.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.documents.loops import STOPPED
from app.documents.markdown import SKIP_ORDER_LABELS
from app.paddlex import tables, titles

FOLLOWERS = ("footer", "vision_footnote", "number", "footnote", "footer_image", "seal")
LEADERS = ("header", "header_image", "number", "seal")


@dataclass(slots=True, eq=False)
class Block:
    """One block of a page (`PaddleOCRVLBlock`)."""

    label: str
    bbox: list[Any]
    content: str
    group_id: int | None = None
    polygon: Any = None
    image: str | None = None  # the figure's markdown path
    global_block_id: int | None = None
    global_group_id: int | None = None
    title_level: int | None = None
    loop: dict[str, Any] | None = None  # the gateway's loop guard stopped it (docs/loops.md)


@dataclass(slots=True)
class Page:
    """A page's result: its blocks, and everything else its JSON carries."""

    result: dict[str, Any]  # page_count, width, height, model_settings, layout_det_res, …
    blocks: list[Block] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        """Its `model_settings`."""
        settings: dict[str, Any] = self.result["model_settings"]
        return settings

    @property
    def width(self) -> int:
        """The page's width (the first page's, for pages concatenated)."""
        width = self.result["width"]
        return int(width[0] if isinstance(width, list) else width)


def restructure(
    pages: list[Page], *, merge_tables: bool, relevel_titles: bool, concatenate: bool
) -> list[Page]:
    """restructure_pages: the pages after table merging and title re-levelling, or one page."""
    number = 0
    for page in pages:
        for block in page.blocks:
            block.global_block_id = block.global_group_id = number
            number += 1
    if merge_tables:
        merge_across(pages)
    if relevel_titles:
        titles.relevel([page.blocks for page in pages])
    if not concatenate or not pages:
        return pages
    first, last = pages[0], pages[-1]  # PaddleX reads the last page's settings here
    joined = {**first.result, "page_count": len(pages)}
    if last.settings.get("use_layout_detection"):
        joined["layout_det_res"] = [page.result.get("layout_det_res") for page in pages]
    if last.settings.get("use_doc_preprocessor"):
        joined["doc_preprocessor_res"] = [page.result.get("doc_preprocessor_res") for page in pages]
    return [Page(joined, [block for page in pages for block in page.blocks])]


def merge_across(pages: Sequence[Page]) -> None:
    """merge_tables_across_pages: a page's first table continues the previous page's last one
    when only headers (before) and footers (after) lie between them and their widths, columns
    or rows agree; its rows join that table, it is left empty and grouped with it."""
    for i in range(len(pages) - 1, 0, -1):
        current = next((b for b in pages[i].blocks if b.label == "table"), None)
        previous = next((b for b in reversed(pages[i - 1].blocks) if b.label == "table"), None)
        if current is None or previous is None:
            continue
        if not _joins(pages[i - 1].blocks, previous, pages[i].blocks, current):
            continue
        previous.content = tables.merge(previous.content, current.content)
        current.content = ""
        current.global_group_id = previous.global_block_id
    everyone = [block for page in pages for block in page.blocks]
    for block in everyone:
        if block.global_block_id != block.global_group_id:
            assert block.global_group_id is not None  # noqa: S101 (numbered above)
            block.global_group_id = everyone[block.global_group_id].global_group_id


def _joins(before: list[Block], previous: Block, after: list[Block], current: Block) -> bool:
    """can_merge_tables."""
    width1 = previous.bbox[2] - previous.bbox[0]
    width2 = current.bbox[2] - current.bbox[0]
    if width1 == 0 or width2 == 0 or abs(width2 - width1) / min(width1, width2) >= 0.1:
        return False
    if not all(b.label in FOLLOWERS for b in before[before.index(previous) + 1 :]):
        return False
    if not all(b.label in LEADERS for b in after[: after.index(current)]):
        return False
    return tables.can_merge(previous.content, current.content)


def pruned(page: Page, formatted: list[str] | None = None) -> dict[str, Any]:
    """The page as `prunedResult`: PaddleX's `_to_json` keys in its order, each block with its
    id, reading order, group (and global ids once restructured); `formatted`: each block's
    content as `format_block_content` writes it (by block id)."""
    result = page.result
    settings = page.settings
    skip = {*SKIP_ORDER_LABELS, *settings.get("markdown_ignore_labels", [])}
    blocks, order = [], 1
    for i, block in enumerate(page.blocks):
        entry: dict[str, Any] = {
            "block_label": block.label,
            "block_content": block.content if formatted is None else formatted[i],
            "block_bbox": block.bbox,
            "block_id": i,
            "block_order": None if block.label in skip else order,
            "group_id": block.group_id if block.group_id is not None else i,
        }
        order += block.label not in skip
        if block.global_block_id is not None:
            entry["global_block_id"] = block.global_block_id
        if block.global_group_id is not None:
            entry["global_group_id"] = block.global_group_id
        if block.polygon is not None:
            entry["block_polygon_points"] = block.polygon
        if block.loop is not None:  # the gateway's own fields: PaddleX's clients ignore them
            entry["stopped"], entry["loop"] = STOPPED, block.loop
        blocks.append(entry)
    shown: dict[str, Any] = {n: result[n] for n in ("page_count", "width", "height") if n in result}
    shown |= {"model_settings": settings, "parsing_res_list": blocks}
    for name, flag in (("spotting_res", None), ("doc_preprocessor_res", "use_doc_preprocessor")):
        if (result.get(name) if flag is None else settings.get(flag)) and name in result:
            shown[name] = result[name]
    if settings.get("use_layout_detection") and "layout_det_res" in result:
        shown["layout_det_res"] = result["layout_det_res"]
    return _prune(shown)


def _prune(value: dict[str, Any]) -> dict[str, Any]:
    """The serving app's prune_result: `input_path` and `page_index` gone at every depth."""
    pruned: dict[str, Any] = _pruned(value)
    return pruned


def _pruned(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if k not in ("input_path", "page_index")}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value
