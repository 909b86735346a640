"""A block's answer as PaddleX's pipeline keeps it: loops cut, math delimiters, tables as HTML.

`content` mirrors the per-block steps of `_paddleocr_vl_assemble_parsing_results` (PaddleX 3.7,
`paddlex/inference/pipelines/paddleocr_vl/pipeline.py`); `truncate_repetitive` and
`untokenize` mirror `uilts.truncate_repetitive_content` and `uilts.untokenize_figure_of_table`.
Pure string work, but a 4,096-token answer makes the repetition search quadratic: it runs in
the worker processes with the rest of a page's assembly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from app.documents import otsl

FIGURE_TOKEN = re.compile(r"\[F(\d+)\]")


def content(label: str, answer: str | None) -> str:
    """The block's content from the model's answer (PaddleX's `block_content`)."""
    text = truncate_repetitive(answer or "", min_count=5000 if label == "table" else 50)
    if ("\\(" in text and "\\)" in text) or ("\\[" in text and "\\]" in text):
        text = text.replace("$", "")
        text = (
            text.replace("\\(", " $ ")
            .replace("\\)", " $")
            .replace("\\[\\[", "\\[")
            .replace("\\]\\]", "\\]")
            .replace("\\[", " $$ ")
            .replace("\\]", " $$ ")
        )
        if label == "formula_number":
            text = text.replace("$", "")
    if label == "table":
        html = otsl.to_html(text)  # convert_otsl_to_html: "" (here None) keeps the text
        if html:
            text = html
    return text


def untokenize(text: str, tokens: Mapping[str, str], shown: Mapping[str, str]) -> str:
    """uilts.untokenize_figure_of_table: each `[F<n>]` of a table whose figure is one of the
    page's shown blocks (`shown`: path -> that block's content) becomes its `<img>` tag."""

    def image(match: re.Match[str]) -> str:
        path = tokens.get(f"[F{match.group(1)}]", match.group(0))
        if path not in shown:
            return match.group(0)
        tag = '<img src="{}" alt="Image"" />'.format(path.replace("-\n", "").replace("\n", " "))
        return tag + (f"\n\n{shown[path]}\n\n" if shown[path] != "" else "")

    return FIGURE_TOKEN.sub(image, text)


def _shortest_repeat(text: str) -> str | None:
    """uilts.find_shortest_repeating_substring."""
    n = len(text)
    for i in range(1, n // 2 + 1):
        if n % i == 0 and text[:i] * (n // i) == text:
            return text[:i]
    return None


def _repeating_suffix(
    text: str, min_len: int = 8, min_repeats: int = 5
) -> tuple[str, str, int] | None:
    """uilts.find_repeating_suffix: (prefix, unit, count) when `text` ends in a repeated unit."""
    for i in range(len(text) // min_repeats, min_len - 1, -1):
        unit = text[-i:]
        if text.endswith(unit * min_repeats):
            count, rest = 0, text
            while rest.endswith(unit):
                rest = rest[:-i]
                count += 1
            return text[: len(text) - count * i], unit, count
    return None


def _one_line_loop(stripped: str, char_threshold: int, min_len: int) -> str | None:
    """A single line ending in, or made of, one repeated phrase: what is left of it."""
    if len(stripped) > 100:
        suffix = _repeating_suffix(stripped, min_len=8, min_repeats=5)
        if suffix is not None and len(suffix[1]) * suffix[2] > len(stripped) * 0.5:
            return suffix[0]
    if len(stripped) > min_len:
        unit = _shortest_repeat(stripped)
        if unit is not None and len(stripped) // len(unit) >= char_threshold:
            return unit
    return None


def truncate_repetitive(
    text: str,
    line_threshold: int = 10,
    char_threshold: int = 10,
    min_len: int = 10,
    min_count: int = 3000,
) -> str:
    """uilts.truncate_repetitive_content: a model stuck in a loop, cut to what it repeated."""
    stripped = text.strip()
    if len(text) < min_count or not stripped:
        return text
    if "\n" not in stripped:
        cut = _one_line_loop(stripped, char_threshold, min_len)
        if cut is not None:
            return cut
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if len(lines) < line_threshold:
        return text
    line, count = Counter(lines).most_common(1)[0]
    if count >= line_threshold and count / len(lines) >= 0.8:
        return line
    return text
