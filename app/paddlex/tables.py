"""Tables merged across pages as PaddleX merges them, without BeautifulSoup.

Mirrors `paddlex/inference/pipelines/layout_parsing/merge_table.py` (PaddleX 3.7, adapted there
from MinerU): `can_merge` is its `can_merge_tables` after the block checks, `merge` its
`perform_table_merge`. PaddleX parses a table's HTML with BeautifulSoup's `html.parser` and
writes the merged one back with `str(soup)`, which re-serialises the whole HTML: `Soup` builds
the same tree from the standard library's HTMLParser, under BeautifulSoup's rules (end tags pop
to their open tag or are dropped, void elements close at once, whitespace-only text becomes one
space or newline, entities decoded, multi-valued attributes re-joined) and writes it back as its
"minimal" formatter does (`&`, `<`, `>` escaped; `<br/>`). The gateway venv stays lean.
"""

from __future__ import annotations

import html.entities
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "menuitem",
    "meta", "param", "source", "track", "wbr", "basefont", "bgsound", "command", "frame",
    "image", "isindex", "nextid", "spacer",
})  # fmt: skip
RAW_TEXT = frozenset({"pre", "textarea"})  # whitespace kept as it is
CDATA = frozenset({"script", "style"})  # their text is written back unescaped
SPACES = " \n\t\x0c\r"
LISTED = {"*": {"class", "accesskey", "dropzone"}, "a": {"rel", "rev"}, "link": {"rel", "rev"},
          "td": {"headers"}, "th": {"headers"}, "area": {"rel"}}  # fmt: skip


class Comment(str):
    """`<!--…-->`: kept, written back as it was, never text."""

    __slots__ = ()


@dataclass(eq=False)
class Element:
    """A tag and what it holds (text is `str`)."""

    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Element | str] = field(default_factory=list)
    parent: Element | None = None

    def find_all(self, *tags: str) -> Iterator[Element]:
        """Every element below this one named one of `tags`, in document order."""
        for child in self.children:
            if isinstance(child, Element):
                if child.tag in tags:
                    yield child
                yield from child.find_all(*tags)

    def text(self) -> str:
        """`get_text()`: the text below, comments left out."""
        return "".join(
            c.text() if isinstance(c, Element) else c
            for c in self.children
            if not isinstance(c, Comment)
        )

    def span(self, name: str) -> int:
        """`int(cell.get(name, 1))` (a value that is no integer counts as 1 here)."""
        value = self.attrs.get(name, "1").strip()
        return int(value) if value.lstrip("+-").isdigit() else 1

    def write(self) -> str:
        """BeautifulSoup's `decode()` with the minimal formatter (attributes sorted by name)."""
        attrs = "".join(f" {k}={_quoted(_escape(v))}" for k, v in sorted(self.attrs.items()))
        if self.tag in VOID and not self.children:
            return f"<{self.tag}{attrs}/>"
        inner = _write(self.children, raw=self.tag in CDATA)
        return f"<{self.tag}{attrs}>{inner}</{self.tag}>"


class Soup(HTMLParser):
    """`BeautifulSoup(markup, "html.parser")`: the document's root holds the parsed nodes."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=False)
        self.root = Element("[document]")
        self._open: list[Element] = [self.root]
        self._data: list[str] = []
        self._closed_voids: list[str] = []
        self.feed(markup)
        self.close()
        self._flush()

    def __str__(self) -> str:
        return _write(self.root.children)

    def _flush(self, comment: bool = False) -> None:
        if not self._data:
            return
        text = "".join(self._data)
        self._data = []
        raw = any(e.tag in RAW_TEXT for e in self._open)
        if not comment and not raw and not text.strip(SPACES):
            text = "\n" if "\n" in text else " "
        node = Comment(text) if comment else text
        self._open[-1].children.append(node)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """A start tag; a void one is closed at once (its later end tag is dropped)."""
        self._start(tag, attrs)
        if tag in VOID:
            self._end(tag)
            self._closed_voids.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """`<tag/>`: opened and closed."""
        self._start(tag, attrs)
        self._end(tag)

    def handle_endtag(self, tag: str) -> None:
        """An end tag: pops to its open element, or is dropped when none is open."""
        if tag in self._closed_voids:
            self._closed_voids.remove(tag)
        else:
            self._end(tag)

    def _start(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._flush()
        listed = LISTED["*"] | LISTED.get(tag, set())
        values: dict[str, str] = {}
        for key, value in attrs:
            text = value or ""
            values[key] = " ".join(text.split()) if key in listed else text
        element = Element(tag, values, parent=self._open[-1])
        self._open[-1].children.append(element)
        self._open.append(element)

    def _end(self, tag: str) -> None:
        self._flush()
        for depth in range(len(self._open) - 1, 0, -1):
            if self._open[depth].tag == tag:
                del self._open[depth:]
                return

    def handle_data(self, data: str) -> None:
        """Text (joined with the text next to it)."""
        self._data.append(data)

    def handle_charref(self, name: str) -> None:
        """`&#…;`: the character, as text (BeautifulSoup's reading of a bad one kept: the
        leading digits, lower-case ones for hex, and the rest as text)."""
        digits, base, allowed = name, 10, "0123456789"
        if name[:1] in "xX":
            digits, base, allowed = name[1:], 16, "0123456789abcdef"
        try:
            code = int(digits, base)
        except ValueError:
            number = digits[: len(digits) - len(digits.lstrip(allowed))]
            rest = digits[len(number) :]
            self.handle_data(_character(int(number, base)) + rest if number else digits)
            return
        self.handle_data(_character(code))

    def handle_entityref(self, name: str) -> None:
        """`&name;`: the character, or the text `&name` for an unknown name."""
        self.handle_data(html.entities.html5.get(f"{name};", f"&{name}"))

    def handle_comment(self, data: str) -> None:
        """A comment."""
        self._flush()
        self._data.append(data)
        self._flush(comment=True)


def _character(code: int) -> str:
    """UnicodeDammit.numeric_character_reference: C1 codes read as Windows-1252."""
    if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    if 0x80 <= code <= 0x9F:
        try:
            return bytes([code]).decode("cp1252")
        except UnicodeDecodeError:
            return chr(code)
    return chr(code)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _quoted(value: str) -> str:
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace('"', "&quot;") + '"'


def _write(nodes: list[Element | str], raw: bool = False) -> str:
    return "".join(
        n.write() if isinstance(n, Element) else f"<!--{n}-->" if isinstance(n, Comment)
        else n if raw else _escape(n)
        for n in nodes
    )  # fmt: skip


# ------------------------------------------------------------------------- merge_table.py


def _half(text: str) -> str:
    """full_to_half: full-width ASCII as ASCII."""
    return "".join(chr(ord(c) - 0xFEE0) if 0xFF01 <= ord(c) <= 0xFF5E else c for c in text)


def total_columns(soup: Soup) -> int:
    """calculate_table_total_columns: the widest row, spans counted."""
    taken: dict[int, set[int]] = {}
    widest = 0
    for r, row in enumerate(soup.root.find_all("tr")):
        column = 0
        for cell in row.find_all("td", "th"):
            while column in taken.setdefault(r, set()):
                column += 1
            wide = cell.span("colspan")
            for below in range(r, r + cell.span("rowspan")):
                taken.setdefault(below, set()).update(range(column, column + wide))
            column += wide
            widest = max(widest, column)
    return widest


def header_rows(first: Soup, second: Soup, most: int = 5) -> int:
    """detect_table_headers: how many leading rows the two tables share."""
    rows1, rows2 = list(first.root.find_all("tr")), list(second.root.find_all("tr"))
    same = 0
    for i in range(min(len(rows1), len(rows2), most)):
        cells1, cells2 = list(rows1[i].find_all("td", "th")), list(rows2[i].find_all("td", "th"))
        if len(cells1) != len(cells2):
            break
        if not all(
            "".join(_half(a.text()).split()) == "".join(_half(b.text()).split())
            and a.span("colspan") == b.span("colspan")
            for a, b in zip(cells1, cells2, strict=True)
        ):
            break
        same += 1
    return same


def _rows_match(first: Soup, second: Soup) -> bool:
    """check_rows_match: the first's last row as wide as the second's first data row."""
    rows1, rows2 = list(first.root.find_all("tr")), list(second.root.find_all("tr"))
    if not rows1 or not rows2:
        return False
    skip = header_rows(first, second)
    if len(rows2) <= skip:
        return False
    last, data = rows1[-1], rows2[skip]
    last_cells, data_cells = list(last.find_all("td", "th")), list(data.find_all("td", "th"))
    wide = sum(c.span("colspan") for c in last_cells) == sum(c.span("colspan") for c in data_cells)
    return wide or len(last_cells) == len(data_cells)


def can_merge(previous: str, current: str) -> bool:
    """The tables' part of can_merge_tables: as many columns, or rows that line up."""
    if not previous or not current:
        return False
    first, second = Soup(previous), Soup(current)
    if not any(first.root.find_all("tr")):  # PaddleX fails there (500): nothing to append to
        return False
    return total_columns(first) == total_columns(second) or _rows_match(first, second)


def merge(previous: str, current: str) -> str:
    """perform_table_merge: the second table's rows below its repeated header appended after
    the first's last row, and the first table written back."""
    first, second = Soup(previous), Soup(current)
    skip = header_rows(first, second)
    rows1, rows2 = list(first.root.find_all("tr")), list(second.root.find_all("tr"))
    target = rows1[-1].parent
    assert target is not None  # noqa: S101 (a row always has a parent: the document's root)
    for row in rows2[skip:]:
        if row.parent is not None:
            row.parent.children.remove(row)
        row.parent = target
        target.children.append(row)
    return str(first)
