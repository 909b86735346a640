"""One page of a document's markdown, from the page as the API shows it: the server's markdown
answer and `ocrvl ocr`'s markdown (stdout and `--out`) are written by this one function.

Imports nothing: `ocrvl` loads it without the server's modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CUT = "<!-- page {} was cut at max_tokens: its text is incomplete -->"


def page_markdown(page: Mapping[str, Any]) -> str:
    """The page's text (its layout markdown, its table as HTML, or its text); a failed page, and
    a page cut by `max_tokens` (after its text), as a comment."""
    error = page.get("error")
    if error is not None:
        return f"<!-- page {page['index']} failed: {error['message']} -->"
    text = page.get("markdown") or page.get("html") or page.get("text") or ""
    if page.get("finish_reason") == "length":  # as JSON's finish_reason and /ui's note say
        return f"{text}\n\n{CUT.format(page['index'])}"
    return str(text)
