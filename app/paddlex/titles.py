"""Paragraph titles re-levelled across a document as PaddleX does it, without numpy or sklearn.

Mirrors `paddlex/inference/pipelines/layout_parsing/title_level.py` (PaddleX 3.7): a title's
level is voted from its numbering (`1.2`, `(3)`, `IV`, `第二章`…), the order in which numbering
styles first appear, and a cluster of title heights (larger type, higher level); keywords such
as ABSTRACT or REFERENCES are level 1. PaddleX clusters the heights with scikit-learn's
`KMeans(n_clusters=min(4, distinct heights), random_state=42, n_init="auto")`; `kmeans`
repeats that computation step for step (k-means++ seeding from numpy's legacy Mersenne Twister
seeded with 42, then Lloyd's iterations) in plain floats, so the same heights give the same
clusters. It keeps an emptied cluster's centre where scikit-learn would move it to the
farthest point (a case 1-D title heights do not reach from a k-means++ start).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

ROMAN = re.compile(r"^\s*([IVX]+)(?:[\.\uff0e\)\s]|$)", flags=re.IGNORECASE)
LETTER = re.compile(r"^\s*([A-Z])(?:[\.\uff0e\)\s])", flags=re.IGNORECASE)
NUM_LIST = re.compile(r"^\s*(\d+(?:\.\d+)*)(?![\uff09)])(?:[\.]?\s*|(?=[A-Z]))")
NUM_LIST_WITH_BRACKET = re.compile(r"^\s*(?:[\(\uff08])?(\d+(?:\.\d+)*)[\)\uff09]")
CHINESE_NUM = re.compile(
    r"^\s*(?:第|[\uff08\(])?([一二三四五六七八九十]{1,2})(?:[章节篇卷部条题讲课回\uff09\)]|(?![a-zA-Z\u4e00-\u9fa5]))",
    flags=re.IGNORECASE,
)
SPECIAL_KEYWORDS = {
    "ABSTRACT", "SUMMARY", "RESUME", "绪论", "引言", "CONTENTS", "REFERENCES", "REFERENCE",
    "参考文献", "APPENDIX", "APPENDICES", "附录", "ACKNOWLEDGMENTS", "INTRODUCTION",
    "BACKGROUNDANDRELATEDWORK", "BACKGROUND", "RELATEDWORK", "THEORETICALMODELS", "DATA",
    "METHOD", "METHODS", "METHODOLOGY", "TOPICANALYSIS", "RESULT", "RESULTS", "DISCUSSION",
    "CONCLUSIONS", "CONCLUSION", "LIMITATIONS", "研究背景", "相关工作", "研究方法", "实验结果",
    "讨论", "结论", "致谢", "目录",
}  # fmt: skip  # each at level 1
SEED = 42
MAX_ITER = 300
TOL = 1e-4


def symbol_and_level(content: str) -> tuple[str | None, int]:
    """get_symbol_and_level: the numbering style and the level it implies (-1: none)."""
    text = str(content).strip()
    if NUM_LIST_WITH_BRACKET.match(text):
        return "NUM_LIST_BRACKET", 4
    if ROMAN.match(text):
        return "ROMAN", 1
    if CHINESE_NUM.match(text):
        return "CHINESE_NUM", 1
    if LETTER.match(text):
        return "LETTER", 2
    if match := NUM_LIST.match(text):
        return "NUM_LIST", match.group(1).count(".") + 1
    return None, -1


def title_height(bbox: Sequence[float], content: str) -> int:
    """get_title_height: the height of one of its lines (the width for vertical text)."""
    x1, y1, x2, y2 = int(bbox[0]), int(bbox[1]), math.ceil(bbox[2]), math.ceil(bbox[3])
    height, width = y2 - y1, x2 - x1
    lines = content.strip().count("\n") + 1
    horizontal = height == 0 or width / height >= 1.0  # PaddleX divides by zero there
    return int(height / lines) if horizontal else int(width / lines)


def levels(titles: Sequence[tuple[Sequence[float], str]]) -> list[int]:
    """compute_levels_for_entries: each (bbox, content) paragraph title's level."""
    heights = [title_height(bbox, content) for bbox, content in titles]
    symbols = [symbol_and_level(content) for _, content in titles]
    clusters = cluster_levels(heights)
    order: dict[str | None, int] = {}
    for symbol, level in symbols:
        if level > 0 and symbol not in order:
            order[symbol] = len(order) + 1
    first_number, found = 0, []
    for (_, content), height, (symbol, level) in zip(titles, heights, symbols, strict=True):
        keyword = str(content).upper().strip().rstrip("\uff1a: ").replace(" ", "")
        if level > 0:
            relative = order[symbol]
            if symbol == "NUM_LIST":
                if first_number:
                    relative = order[symbol] + (level - first_number)
                else:
                    first_number = level
            votes = Counter([level, relative, clusters[height]]).most_common(1)[0]
            found.append(votes[0] if votes[1] > 1 else relative)
        elif keyword in SPECIAL_KEYWORDS:
            found.append(1)
        else:
            found.append(clusters[height])
    return [int(level) for level in found]


def cluster_levels(heights: Sequence[int], most: int = 4) -> dict[int, int]:
    """cluster_global_heights: each distinct height's cluster rank (1: the largest type)."""
    distinct = sorted(set(heights))
    if not distinct:
        return {}
    centers = kmeans([float(h) for h in heights], min(most, len(distinct)))
    by_size = sorted(range(len(centers)), key=lambda i: -centers[i])
    rank = {old: new + 1 for new, old in enumerate(by_size)}
    return {h: rank[min(range(len(centers)), key=lambda i: abs(h - centers[i]))] for h in distinct}


def _numpy_random(seed: int) -> random.Random:
    """A Random whose `random()` is numpy's `RandomState(seed).random_sample()` (the same
    MT19937 and 53-bit doubles; numpy seeds an integer with init_genrand)."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
    generator = random.Random()  # noqa: S311 (scikit-learn's seeding, not secrets)
    generator.setstate((3, (*state, 624), None))
    return generator


def _first_at_least(cumulative: Sequence[float], value: float) -> int:
    """np.searchsorted(cumulative, value) (side left), clipped to the last index."""
    for i, total in enumerate(cumulative):
        if total >= value:
            return i
    return len(cumulative) - 1


def _distances(center: float, points: Sequence[float]) -> list[float]:
    """_euclidean_distances(center, X, squared=True) as scikit-learn computes it."""
    return [max(-2.0 * (center * x) + center * center + x * x, 0.0) for x in points]


def _cumsum(values: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for value in values:
        total += value
        out.append(total)
    return out


def _seeds(points: Sequence[float], k: int, rng: random.Random) -> list[float]:
    """_kmeans_plusplus with unit weights."""
    n = len(points)
    weights = _cumsum([1.0 / n] * n)
    first = rng.random()
    chosen = next((i for i, c in enumerate(weights) if c / weights[-1] > first), n - 1)
    centers = [points[chosen]]
    closest = _distances(points[chosen], points)
    potential = sum(closest)
    trials = 2 + int(math.log(k))
    for _ in range(1, k):
        draws = [rng.random() * potential for _ in range(trials)]
        cumulative = _cumsum(closest)
        candidates = [_first_at_least(cumulative, draw) for draw in draws]
        options = [
            [min(a, b) for a, b in zip(closest, _distances(points[c], points), strict=True)]
            for c in candidates
        ]
        potentials = [sum(option) for option in options]
        best = potentials.index(min(potentials))
        potential, closest = potentials[best], options[best]
        centers.append(points[candidates[best]])
    return centers


def kmeans(values: Sequence[float], k: int) -> list[float]:
    """KMeans(n_clusters=k, random_state=42, n_init="auto").fit(values).cluster_centers_."""
    mean = sum(values) / len(values)
    points = [v - mean for v in values]
    tolerance = sum(p * p for p in points) / len(points) * TOL
    centers = _seeds(points, k, _numpy_random(SEED))
    labels: list[int] | None = None
    for _ in range(MAX_ITER):
        scores = [[c * c - 2.0 * x * c for c in centers] for x in points]
        new = [row.index(min(row)) for row in scores]
        sums: dict[int, list[float]] = {}
        for x, label in zip(points, new, strict=True):
            sums.setdefault(label, []).append(x)
        moved = [sum(sums[j]) / len(sums[j]) if j in sums else c for j, c in enumerate(centers)]
        shift = sum((a - b) ** 2 for a, b in zip(moved, centers, strict=True))
        centers = moved
        if new == labels or shift <= tolerance:
            break
        labels = new
    return [c + mean for c in centers]


def relevel(pages: Sequence[Sequence[Any]]) -> None:
    """assign_levels_to_parsing_res: `title_level` set on every paragraph title of `pages`
    (blocks with `label`, `bbox`, `content`), all pages' titles clustered together."""
    titles = [block for page in pages for block in page if block.label == "paragraph_title"]
    for block, level in zip(titles, levels([(b.bbox, b.content) for b in titles]), strict=True):
        block.title_level = level
