"""PaddleOCR-VL's table output (OTSL tokens) as an HTML table, the way PaddleOCR shows it.

The rules follow PaddleX's `convert_otsl_to_html` (`paddlex/inference/pipelines/paddleocr_vl/
uilts.py`, which the PaddleOCR-VL pipeline applies to every `table` block): exactly six tags,
`<fcel>` (a cell with text after it), `<ecel>` (an empty cell), `<lcel>` (merged with the cell
to its left), `<ucel>` (merged with the cell above), `<xcel>` (both) and `<nl>` (end of row).
Ragged rows are first evened to the width that changes the fewest cells (never narrower than
the last filled cell of any row); spans are read from the `lcel`/`xcel` run to the right and
the `ucel`/`xcel` run below each `fcel`/`ecel`; cell text is HTML-escaped.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

FCEL, ECEL, LCEL, UCEL, XCEL, NL = "<fcel>", "<ecel>", "<lcel>", "<ucel>", "<xcel>", "<nl>"
CELL_TAGS = (FCEL, ECEL, LCEL, UCEL, XCEL)
_CELL = re.compile(
    r"(<fcel>|<ecel>|<lcel>|<ucel>|<xcel>)(.*?)(?=<fcel>|<ecel>|<lcel>|<ucel>|<xcel>|$)", re.DOTALL
)


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell that starts at (row, column), with its spans."""

    row: int
    column: int
    text: str
    rowspan: int
    colspan: int


def is_otsl(text: str) -> bool:
    """Whether `text` holds OTSL cell tags at all."""
    return any(tag in text for tag in CELL_TAGS)


def to_html(otsl: str) -> str | None:
    """`<table>…</table>` for `otsl`, or None when it holds no cell."""
    rows = _even_rows(_rows(otsl))
    if not rows:
        return None
    cells = _cells(rows)
    if not cells:  # only merge tags: nothing to show (PaddleX gives "" too)
        return None
    width = len(rows[0])
    owner: list[list[Cell | None]] = [[None] * width for _ in rows]
    for cell in cells:  # a later cell wins where spans overlap, as in PaddleX
        for r in range(cell.row, min(cell.row + cell.rowspan, len(rows))):
            for c in range(cell.column, min(cell.column + cell.colspan, width)):
                owner[r][c] = cell
    parts = []
    for r, line in enumerate(owner):
        parts.append("<tr>")
        for c, owned in enumerate(line):
            if owned is None:  # a merge tag with no cell to merge into: shown as an empty cell
                parts.append("<td></td>")
            elif (owned.row, owned.column) == (r, c):
                parts.append(_td(owned))
        parts.append("</tr>")
    return f"<table>{''.join(parts)}</table>"


def _td(cell: Cell) -> str:
    spans = ""
    if cell.rowspan > 1:
        spans += f' rowspan="{cell.rowspan}"'
    if cell.colspan > 1:
        spans += f' colspan="{cell.colspan}"'
    return f"<td{spans}>{html.escape(cell.text)}</td>"


def _rows(otsl: str) -> list[list[tuple[str, str]]]:
    """(tag, text) per cell, per row; text outside cells is dropped."""
    rows = []
    for line in otsl.strip().split(NL):
        cells = [(tag, text) for tag, text in _CELL.findall(line)]
        if cells:
            rows.append(cells)
    return rows


def _even_rows(rows: list[list[tuple[str, str]]]) -> list[list[tuple[str, str]]]:
    """Every row cut or padded with empty cells to one width (PaddleX's `otsl_pad_to_sqr_v2`)."""
    if not rows:
        return rows
    narrowest = max(
        max((i + 1 for i, (tag, _) in enumerate(row) if tag == FCEL), default=0) for row in rows
    )
    widest = max(narrowest, *(len(row) for row in rows))
    width = min(range(narrowest, widest + 1), key=lambda w: sum(abs(len(row) - w) for row in rows))
    return [row[:width] + [(ECEL, "")] * (width - len(row)) for row in rows]


def _cells(rows: list[list[tuple[str, str]]]) -> list[Cell]:
    cells = []
    for r, row in enumerate(rows):
        for c, (tag, text) in enumerate(row):
            if tag not in (FCEL, ECEL):
                continue
            colspan = 1 + _run([tag for tag, _ in row[c + 1 :]], (LCEL, XCEL))
            rowspan = 1 + _run([below[c][0] for below in rows[r + 1 :]], (UCEL, XCEL))
            content = text.strip() if tag == FCEL else ""
            cells.append(Cell(r, c, content, rowspan, colspan))
    return cells


def _run(tags: list[str], spanning: tuple[str, ...]) -> int:
    """How many of the first `tags` merge into the cell before them (right or down)."""
    count = 0
    for tag in tags:
        if tag not in spanning:
            break
        count += 1
    return count
