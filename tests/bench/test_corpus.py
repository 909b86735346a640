"""The page corpus: varied synthetic pages, cached once, never repeated within a level."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from PIL import Image

from app.bench.corpus import GENERATOR, draws, from_folder, synthetic


def _pixels(data: bytes) -> tuple[tuple[int, int], str]:
    image = Image.open(io.BytesIO(data))
    return image.size, hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()


def test_synthetic_pages_differ_in_pixels_and_size(tmp_path: Path) -> None:
    """No two pages share their pixels; the corpus spans several page sizes."""
    pages = synthetic(24, cache=tmp_path, workers=2)
    decoded = [_pixels(page.data) for page in pages]
    assert len({digest for _, digest in decoded}) == 24
    assert len({size for size, _ in decoded}) >= 2
    assert all(page.mime == "image/jpeg" for page in pages)


def test_synthetic_pages_are_generated_once_and_reused(tmp_path: Path) -> None:
    """A second corpus of the same pages reads the cache: same bytes, files untouched."""
    first = synthetic(10, cache=tmp_path, workers=2)
    files = sorted((tmp_path / GENERATOR).glob("page-*.jpg"))
    stamps = [f.stat().st_mtime_ns for f in files]
    second = synthetic(10, cache=tmp_path, workers=2)
    assert len(files) == 10
    assert [p.data for p in first] == [p.data for p in second]
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_a_level_draws_each_page_at_most_once(tmp_path: Path) -> None:
    """A level's draw is a permutation of the corpus: it ends rather than repeat an image."""
    pages = synthetic(12, cache=tmp_path, workers=2)
    drawn = [page.name for page in draws(pages, seed=3)]
    assert sorted(drawn) == sorted(p.name for p in pages)
    assert drawn != [p.name for p in pages]  # shuffled, so levels differ in order


def test_a_folder_of_pages_keeps_its_types(tmp_path: Path) -> None:
    """--pages DIR takes JPEG, PNG and WebP images with their MIME types and skips the rest."""
    Image.new("RGB", (40, 60), "white").save(tmp_path / "a.png")
    Image.new("RGB", (40, 60), "white").save(tmp_path / "b.jpg")
    (tmp_path / "notes.txt").write_text("not a page")
    pages = from_folder(tmp_path)
    assert [(p.name, p.mime) for p in pages] == [("a.png", "image/png"), ("b.jpg", "image/jpeg")]


def test_an_empty_folder_says_what_it_needs(tmp_path: Path) -> None:
    """A folder without images is refused with the formats it accepts."""
    with pytest.raises(ValueError, match=r"\.jpg, \.jpeg, \.png or \.webp"):
        from_folder(tmp_path)
