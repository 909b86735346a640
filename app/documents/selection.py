"""The `pages` option: "1-3,7" (1-based, inclusive) resolved against a document's page count."""

from __future__ import annotations

from dataclasses import dataclass

from app.documents.errors import DocumentError
from app.errors import quoted

EXAMPLE = 'page numbers from 1 and ranges, comma-separated, e.g. "1-3,7"'


@dataclass(frozen=True, slots=True)
class PageSelection:
    """Inclusive 1-based ranges, in the order given; an open end runs to the last page."""

    ranges: tuple[tuple[int, int | None], ...]

    @classmethod
    def parse(cls, text: str | None) -> PageSelection | None:
        """None for every page; DocumentError (param `pages`) for anything malformed."""
        if text is None or not text.strip():
            return None
        ranges: list[tuple[int, int | None]] = []
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            try:
                start = int(first)
                end = (int(last) if last.strip() else None) if dash else start
            except ValueError:
                raise DocumentError(
                    f"`pages` must be {EXAMPLE}; got {quoted(text)}", "invalid_pages", "pages"
                ) from None
            if start < 1 or (end is not None and end < start):
                raise DocumentError(
                    "`pages` ranges start at 1 and do not run backwards; "
                    f"got {quoted(part.strip())}",
                    "invalid_pages",
                    "pages",
                )
            ranges.append((start, end))
        return cls(tuple(ranges))

    def resolve(self, count: int, limit: int) -> list[int]:
        """0-based page indices, each once, in document order; checks range and `limit`."""
        chosen: set[int] = set()
        for start, end in self.ranges:
            last = count if end is None else end
            if start > count or last > count:
                raise DocumentError(
                    f"`pages` asks for page {max(start, last)} but the document has {count}",
                    "page_out_of_range",
                    "pages",
                )
            chosen.update(range(start - 1, last))
            if len(chosen) > limit:
                break
        return check_count(sorted(chosen), limit)


def resolve(selection: PageSelection | None, count: int, limit: int) -> list[int]:
    """The pages to read: the selection, or every page."""
    if selection is None:
        return check_count(list(range(min(count, limit + 1))), limit, count)
    return selection.resolve(count, limit)


def check_count(pages: list[int], limit: int, total: int | None = None) -> list[int]:
    """`pages`, or DocumentError when there are more than `limit` (OCRVL_MAX_PAGES)."""
    if len(pages) > limit:
        many = total if total is not None else "more"
        raise DocumentError(
            f"the request asks for {many} pages; at most {limit} per request "
            "(OCRVL_MAX_PAGES): send fewer, or choose some with `pages`",
            "too_many_pages",
            "pages",
        )
    return pages
