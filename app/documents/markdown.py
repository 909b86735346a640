"""A page's blocks and markdown, assembled as PaddleX's PaddleOCR-VL pipeline does it.

    assemble(plan, answers, options)  the block list (PaddleX's `parsing_res_list`, as JSON) and
                                      the page's markdown (`PaddleOCRVLResult._to_markdown`)

Mirrors (PaddleX 3.7): `pipeline._paddleocr_vl_assemble_parsing_results` (which blocks stay,
their content, figure paths, tables' figure tokens), `result.PaddleOCRVLResult._to_json` (block
order numbers), `_build_handle_funcs_dict` with `common/result/converter/markdown_format_funcs.
build_handle_funcs_dict` (one formatter per label, `markdown_ignore_labels` left out) and
`MarkdownConverter.convert` (blocks joined by blank lines, formula numbers). Runs in a worker.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.documents import answers, loops
from app.documents.crops import PagePlan, PlannedBlock
from app.documents.layout_options import LayoutOptions

SKIP_ORDER_LABELS = (
    "figure_title", "vision_footnote", "image", "chart", "table", "header", "header_image",
    "footer", "footer_image", "footnote", "aside_text",
)  # fmt: skip
_NUMBERING = (
    r"(?:[1-9][0-9]*(?:\.[1-9][0-9]*)*[\.、]?|[\(\uff08](?:[1-9][0-9]*|["
    r"一二三四五六七八九十百千万亿零壹贰叁肆伍陆柒捌玖拾]+)[\)\uff09]|["
    r"一二三四五六七八九十百千万亿零壹贰叁肆伍陆柒捌玖拾]+[、\.]?|(?:I|II|III|IV|V|VI|VII|VIII|IX|X)(?:\.|\s))"
)
TITLE = re.compile(r"^\s*(" + _NUMBERING + r")(\s*)(.*)$")  # compile_title_pattern


@dataclass(frozen=True, slots=True)
class BlockAnswer:
    """What the model answered for one block (picklable: the error is its OpenAI body)."""

    text: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    loop: dict[str, Any] | None = None  # the loop guard stopped it: {"unit", "tokens"[, "retry"]}


@dataclass(slots=True)
class Parsed:
    """One page, assembled."""

    blocks: list[dict[str, Any]]
    markdown: str
    images: dict[str, str]
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    sent: int = 0  # blocks that went to the model
    failed: int = 0  # of those, how many failed


@dataclass(slots=True)
class _Block:
    planned: PlannedBlock
    index: int
    content: str
    answer: BlockAnswer | None


def assemble(
    plan: PagePlan, replies: Sequence[BlockAnswer | None], options: LayoutOptions
) -> Parsed:
    """The page's block list and markdown from its plan and each block's answer (None: the
    block was not sent)."""
    shown = {
        planned.image_path: answers.content(planned.label, reply.text if reply else None)
        for planned, reply in zip(plan.blocks, replies, strict=True)
        if planned.image_path is not None
    }  # the page's figures by path (image_path_to_obj_map), dropped ones included
    kept: list[_Block] = []
    for planned, reply in zip(plan.blocks, replies, strict=True):
        if planned.dropped:
            continue
        text = answers.content(planned.label, reply.text) if reply is not None else ""
        kept.append(_Block(planned, len(kept), text, reply))
    for block in kept:
        if block.planned.token_map:
            block.content = answers.untokenize(block.content, block.planned.token_map, shown)
    entries = _entries(kept, options)
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    sent = failed = 0
    reasons = set()
    for block in kept:
        if block.answer is None:
            continue
        sent += 1
        failed += block.answer.error is not None
        reasons.add(block.answer.finish_reason)
        for name in usage:
            usage[name] += int((block.answer.usage or {}).get(name) or 0)
    finish = next((r for r in ("length", loops.STOPPED) if r in reasons), "stop")
    text = _markdown(kept, options, plan.width)
    return Parsed(entries, text, plan.images, usage, finish, sent, failed)


def _entries(kept: Sequence[_Block], options: LayoutOptions) -> list[dict[str, Any]]:
    """The blocks as the API shows them; `order` as PaddleX's `block_order`."""
    skip = {*SKIP_ORDER_LABELS, *options.ignore_labels}
    entries, order = [], 1
    for block in kept:
        planned = block.planned
        entry: dict[str, Any] = {
            "index": block.index,
            "label": planned.label,
            "bbox": planned.bbox,
            "score": planned.score,
            "order": None if planned.label in skip else order,
            "group": planned.group if planned.group is not None else block.index,
            "text": block.content,
        }
        order += planned.label not in skip
        if planned.polygon is not None:
            entry["polygon"] = planned.polygon
        if planned.label == "table" and block.content.startswith("<table>"):
            entry["html"] = block.content
        if "formula" in planned.label and planned.label != "formula_number":
            entry["latex"] = _bare_latex(block.content)
        if planned.image_path is not None:
            entry["image"] = planned.image_path
        for name in ("guard", "skipped"):
            if getattr(planned, name) is not None:
                entry[name] = getattr(planned, name)
        if block.answer is not None:
            entry["finish_reason"] = block.answer.finish_reason
            entry["usage"] = block.answer.usage
            if block.answer.error is not None:
                entry["error"] = block.answer.error
            if block.answer.loop is not None:
                entry["stopped"], entry["loop"] = loops.STOPPED, block.answer.loop
        entries.append(entry)
    return entries


def _bare_latex(text: str) -> str:
    """A formula's LaTeX without the `$$`/`$` the pipeline put around it."""
    bare = text.strip()
    for mark in ("$$", "$"):
        if bare.startswith(mark) and bare.endswith(mark) and len(bare) >= 2 * len(mark):
            return bare[len(mark) : -len(mark)].strip()
    return bare


# --------------------------------------------------------------------------------- markdown


def _markdown(kept: Sequence[_Block], options: LayoutOptions, page_width: int) -> str:
    """MarkdownConverter.convert (PaddleOCR-VL: formula numbers, no paragraph flags)."""
    handlers = label_handlers(options, page_width)
    text = ""
    for n, block in enumerate(kept):
        label = block.planned.label
        handle = handlers.get(label)
        if handle is None:
            continue
        if block.answer is not None and block.answer.error is not None:
            message = str(block.answer.error.get("message", "")).replace("--", "- -")
            piece = f"<!-- block {block.index} ({label}) failed: {message} -->"
        else:
            content = block.content
            if options.formula_number and label in ("display_formula", "formula"):
                following = kept[n + 1] if n + 1 < len(kept) else None
                if following is not None and following.planned.label == "formula_number":
                    content = f"$${content.replace('$$', '')} \\tag*{{{following.content}}}$$"
            piece = handle(block.planned, content)
        text = text + "\n\n" + piece if text else piece
    return text


Handler = Callable[[PlannedBlock, str], str]


def _collapse(text: str) -> str:
    return text.replace("-\n", "").replace("\n", " ")


def _centered(text: str, collapse: bool = True) -> str:
    return f'<div style="text-align: center;">{_collapse(text) if collapse else text}</div>\n'


def _title(block: PlannedBlock, content: str) -> str:
    """format_title: numbering normalised, `#` per level (dots + 1, at least `##`)."""
    match = TITLE.match(content)
    if match:
        content = match.group(1).strip() + " " + match.group(3).lstrip()
    content = content.rstrip(".")
    level = content.count(".") + 1 if "." in content else 1
    return _collapse(f"#{'#' * level} {content}")


def _image(page_width: int, show: bool, pretty: bool) -> Handler:
    """format_image_scaled_by_html (centred) or format_image_plain."""

    def handle(block: PlannedBlock, content: str) -> str:
        if block.image_path is None:
            return _centered("", collapse=not show) if pretty else ""
        if not pretty:
            tag = f"![]({_collapse(block.image_path)})"
        else:
            scale = int((block.bbox[2] - block.bbox[0]) / page_width * 100)
            tag = f'<img src="{_collapse(block.image_path)}" alt="Image" width="{scale}%" />'
        info = tag + (f"\n\n{content}\n\n" if show else "")
        return _centered(info, collapse=not show) if pretty else info

    return handle


def _chart(block: PlannedBlock, content: str) -> str:
    """format_chart2html_table."""
    lines = content.split("\n")
    header, rows = lines[0].split("|"), [line.split("|") for line in lines[1:]]
    html = "<table border=1 style='margin: auto; width: max-content;'>\n"
    html += "  <thead><tr>" + "".join(
        f"<th style='text-align: center;'>{cell.strip()}</th>" for cell in header
    ) + "</tr></thead>\n"  # fmt: skip
    html += "  <tbody>\n"
    for row in rows:
        cells = "".join(f"<td style='text-align: center;'>{cell.strip()}</td>" for cell in row)
        html += f"    <tr>{cells}</tr>\n"
    return html + "  </tbody>\n</table>"


def _table(pretty: bool) -> Handler:
    """format_table_center (pretty) or simplify_table."""

    def handle(block: PlannedBlock, content: str) -> str:
        if not pretty:
            code = "\n" + content
            for tag in ("<html>", "</html>", "<body>", "</body>"):
                code = code.replace(tag, "")
            return "\n" + code
        styled = content.replace(
            "<table>", "<table border=1 style='margin: auto; word-wrap: break-word;'>"
        )
        styled = styled.replace("<th>", "<th style='text-align: center; word-wrap: break-word;'>")
        styled = styled.replace("<td>", "<td style='text-align: center; word-wrap: break-word;'>")
        return "\n" + styled

    return handle


def _first_line(
    templates: tuple[str, ...], heading: Callable[[str], str], splitter: str
) -> Handler:
    """format_first_line: the first non-blank line made a heading when it is a template."""

    def handle(block: PlannedBlock, content: str) -> str:
        lines = content.split(splitter)
        for i, line in enumerate(lines):
            if line.strip() == "":
                continue
            if line.lower() in templates:
                lines[i] = heading(line)
            break
        return splitter.join(lines)

    return handle


def label_handlers(options: LayoutOptions, page_width: int) -> dict[str, Handler]:
    """build_handle_funcs_dict for PaddleOCR-VL (pretty or not), ignored labels removed."""

    def plain(block: PlannedBlock, content: str) -> str:
        return content

    def paragraphs(block: PlannedBlock, content: str) -> str:
        return content.replace("\n\n", "\n").replace("\n", "\n\n")

    def caption(block: PlannedBlock, content: str) -> str:
        return _centered(content) if options.pretty else content

    image = _image(page_width, options.ocr_images, options.pretty)
    seal = _image(page_width, options.seal, options.pretty)
    handlers: dict[str, Handler] = {
        "paragraph_title": _title, "abstract_title": _title, "reference_title": _title,
        "content_title": _title,
        "doc_title": lambda block, content: _collapse(f"# {content}"),
        "table_title": caption, "figure_title": caption, "chart_title": caption,
        "vision_footnote": paragraphs, "text": paragraphs, "ocr": paragraphs,
        "vertical_text": paragraphs, "reference_content": paragraphs,
        "abstract": _first_line(("摘要", "abstract"), lambda line: f"## {line}\n", " "),
        "content": lambda block, content: content.replace("-\n", "  \n").replace("\n", "  \n"),
        "image": image, "chart": _chart if options.chart else image, "formula": plain,
        "display_formula": plain, "inline_formula": plain, "table": _table(options.pretty),
        "reference": _first_line(("参考文献", "references"), lambda line: f"## {line}", "\n"),
        "algorithm": lambda block, content: content.strip("\n"),
        "seal": seal, "spotting": plain, "number": plain, "footnote": plain, "header": plain,
        "header_image": image, "footer": plain, "footer_image": image, "aside_text": plain,
    }  # fmt: skip
    for label in options.ignore_labels:
        handlers.pop(label, None)
    return handlers
