"""bench.gpu.corpus: varied pages drawn at run time, their boxes from their shape alone, output
lengths from a distribution, and the requests the floor times."""

from __future__ import annotations

import hashlib
import io
import statistics

from PIL import Image

from bench.gpu import corpus


def test_pages_are_varied_distinct_and_reproducible() -> None:
    """Two rounds of the seven kinds: every page's pixels differ, a page drawn twice is the same
    JPEG, and sizes and block counts vary (2 to 10 blocks, several sizes)."""
    drawn = [corpus.draw(n) for n in range(14)]
    assert len({hashlib.sha256(d).digest() for d in drawn}) == 14
    assert corpus.draw(3) == drawn[3]
    sizes = {Image.open(io.BytesIO(d)).size for d in drawn}
    assert len(sizes) >= 8
    assert {len(blocks) for _, blocks in corpus.KINDS.values()} >= {2, 3, 7, 10}


def test_each_kinds_boxes_come_back_from_its_aspect_ratio_at_any_scale() -> None:
    """The stand-in knows only the size it was sent: a page's kind (labels, order, count) is
    found at full size and resized to a third, its boxes in that size's pixels."""
    for number in range(14):
        name, (width, height) = corpus.kind_of(number)
        labels = [label for label, _ in corpus.KINDS[name][1]]
        for w, h in ((width, height), (width // 3, height // 3)):
            found = corpus.boxes(w, h)
            assert [b["label"] for b in found] == labels
            assert [b["order"] for b in found] == list(range(1, len(labels) + 1))
            assert all(0 <= b["coordinate"][2] <= w and 0 <= b["coordinate"][3] <= h
                       for b in found)  # fmt: skip


def test_output_lengths_follow_a_seeded_clipped_log_normal() -> None:
    """500 pages: median near 400, many distinct lengths (no page repeated with one length),
    all within [32, 2000], the same length for a page every time."""
    lengths = corpus.Lengths()
    drawn = [lengths.of(n) for n in range(500)]
    assert 340 <= statistics.median(drawn) <= 460
    assert len(set(drawn)) > 250
    assert min(drawn) >= 32
    assert max(drawn) <= 2000
    assert lengths.of(7) == corpus.Lengths().of(7)


def test_the_work_reads_each_page_whole_or_by_the_blocks_the_gateway_sends() -> None:
    """Per page: one whole-page request of its visual tokens and length; by blocks each block
    sent gets its share of that length (at least the page's length in all)."""
    work = corpus.work(7, corpus.Lengths())
    assert len(work["whole"]) == len(work["blocks"]) == 7
    for number, (whole, blocks) in enumerate(zip(work["whole"], work["blocks"], strict=True)):
        assert whole == [[corpus.page_tokens(number), corpus.Lengths().of(number)]]
        assert len(blocks) >= 2
        assert sum(o for _, o in blocks) >= whole[0][1]
        assert all(v >= 144 for v, _ in blocks)  # PaddleX's min_pixels: 144 visual tokens
