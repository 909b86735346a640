"""The `pages` option and file sniffing: the checks that run before any worker is asked."""

from __future__ import annotations

import pytest

from app.documents.errors import DocumentError
from app.documents.selection import PageSelection, resolve
from app.documents.sniff import sniff


@pytest.mark.parametrize(
    ("text", "count", "pages"),
    [
        (None, 3, [0, 1, 2]),
        ("", 3, [0, 1, 2]),
        ("2", 3, [1]),
        ("1-3,7", 9, [0, 1, 2, 6]),
        ("3,1", 3, [0, 2]),
        ("2-", 4, [1, 2, 3]),
        ("1-2,2-3", 3, [0, 1, 2]),
    ],
)
def test_pages_resolve_to_each_page_once_in_document_order(
    text: str | None, count: int, pages: list[int]
) -> None:
    """1-based ranges become 0-based indices, sorted, duplicates merged, open ends run on."""
    assert resolve(PageSelection.parse(text), count, limit=100) == pages


@pytest.mark.parametrize("text", ["a", "1-b", "0", "3-1", "-2", "1;2"])
def test_malformed_pages_are_refused_naming_pages(text: str) -> None:
    """Anything but 1-based numbers and ranges is a 400 on `pages`."""
    with pytest.raises(DocumentError) as caught:
        PageSelection.parse(text)
    assert caught.value.param == "pages"


def test_pages_past_the_end_are_refused() -> None:
    """Asking for page 5 of 3 says how many pages there are."""
    with pytest.raises(DocumentError, match="has 3") as caught:
        resolve(PageSelection.parse("2-5"), 3, limit=100)
    assert caught.value.code == "page_out_of_range"


@pytest.mark.parametrize("text", [None, "1-11"])
def test_more_pages_than_the_limit_are_refused(text: str | None) -> None:
    """OCRVL_MAX_PAGES applies to the pages asked for (all of them when `pages` is absent)."""
    with pytest.raises(DocumentError, match="OCRVL_MAX_PAGES") as caught:
        resolve(PageSelection.parse(text), 50, limit=10)
    assert caught.value.code == "too_many_pages"


def test_a_selection_within_the_limit_of_a_long_document_is_served() -> None:
    """A 1,000-page document is fine when only a few pages are asked for."""
    assert resolve(PageSelection.parse("998-1000"), 1000, limit=10) == [997, 998, 999]


@pytest.mark.parametrize(
    ("head", "name"),
    [
        (b"\x89PNG\r\n\x1a\n....", "PNG"),
        (b"\xff\xd8\xff\xe0..JFIF", "JPEG"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WEBP"),
        (b"II*\x00\x08\x00", "TIFF"),
        (b"MM\x00*\x00\x00", "TIFF"),
        (b"BM\x00\x00", "BMP"),
        (b"%PDF-1.7\n", "PDF"),
        (b"\xef\xbb\xbf\n%PDF-1.4", "PDF"),
    ],
)
def test_supported_files_are_recognised_by_their_magic(head: bytes, name: str) -> None:
    """The first bytes alone tell the kind; the extension and Content-Type are not trusted."""
    assert sniff(head).name == name


@pytest.mark.parametrize(
    ("head", "code"),
    [(b"", "empty_file"), (b"GIF89a", "unsupported_file"), (b"<html>", "unsupported_file")],
)
def test_other_files_are_refused_naming_file(head: bytes, code: str) -> None:
    """Empty or unsupported files are a 400 on `file` that lists what is supported."""
    with pytest.raises(DocumentError) as caught:
        sniff(head)
    assert (caught.value.param, caught.value.code) == ("file", code)
