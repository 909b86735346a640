"""The page corpus: varied synthetic pages, cached once, never repeated within a level."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from PIL import Image

from app.bench.corpus import GENERATOR, draws, from_folder, resized, synthetic
from app.bench.load import MM_PROCESSOR_KWARGS
from app.documents.resize import smart_resize

LOW, HIGH = MM_PROCESSOR_KWARGS["min_pixels"], MM_PROCESSOR_KWARGS["max_pixels"]


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


def test_resized_pages_are_at_the_models_size_and_made_once(tmp_path: Path) -> None:
    """--resized: every page at smart_resize of its own size (multiples of 28, within the
    pixel bounds), JPEG, same name; a second call reads the cache and rewrites nothing."""
    pages = synthetic(12, cache=tmp_path, workers=2)
    small = resized(pages, LOW, HIGH, cache=tmp_path, workers=2)
    originals = [Image.open(io.BytesIO(page.data)).size for page in pages]
    sizes = [Image.open(io.BytesIO(page.data)).size for page in small]
    assert len(set(originals)) >= 2  # several page sizes went in
    for (width, height), size in zip(originals, sizes, strict=True):
        assert size == smart_resize(height, width, LOW, HIGH)[::-1]
        assert (size[0] % 28, size[1] % 28) == (0, 0)
        assert LOW <= size[0] * size[1] <= HIGH
    assert any(size != original for size, original in zip(sizes, originals, strict=True))
    assert [p.name for p in small] == [p.name for p in pages]
    assert all(p.mime == "image/jpeg" and p.data[:2] == b"\xff\xd8" for p in small)
    files = sorted((tmp_path / f"{GENERATOR}-resized-{LOW}-{HIGH}").glob("*.jpg"))
    stamps = [f.stat().st_mtime_ns for f in files]
    again = resized(pages, LOW, HIGH, cache=tmp_path, workers=2)
    assert len(files) == 12
    assert [p.data for p in again] == [p.data for p in small]
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_a_page_the_model_refuses_is_named(tmp_path: Path) -> None:
    """A page past the model's 200:1 aspect ratio stops --resized with the page's name."""
    Image.new("RGB", (6000, 20), "white").save(tmp_path / "strip.png")
    with pytest.raises(ValueError, match=r"page strip\.png: .*200:1 aspect ratio"):
        resized(from_folder(tmp_path), LOW, HIGH)
