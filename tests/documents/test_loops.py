"""The loop detector (app/documents/loops.py): loops of each kind stop, legitimate repetition does
not, and the cut keeps the text before the loop and one occurrence of its unit."""

from __future__ import annotations

import pytest

from app.documents import loops
from app.documents.answers import truncate_repetitive
from app.documents.loops import CHECK_EVERY, FORMULA, TABLE, TEXT, Limits, Watch

PREFIX = "Results of the second survey, by region and year. "
ROW = "<fcel>Total<fcel>12<fcel>7<nl>"


def stop_point(text: str, limits: Limits, step: int = 3) -> tuple[int, str] | None:
    """Feed `text` to a Watch a few characters at a time, as a stream arrives: (characters
    seen when it stopped, the cut), or None when it never stops."""
    watch = Watch(limits)
    for end in range(step, len(text) + step, step):
        seen = text[:end]
        if watch.sees_loop(seen):
            assert watch.loop is not None
            return len(seen), watch.loop.cut(seen)
    return None


@pytest.mark.parametrize(
    ("prefix", "unit", "limits"),
    [
        (PREFIX, "…", TEXT),  # one character (PaddleOCR #18083: endless ……)
        (PREFIX, "lorem ipsum ", TEXT),  # a short phrase
        (PREFIX, "| 2019 | 4.5 | 3.2 |\n", TEXT),  # a repeated line
        ("".join(f"<fcel>Region {i}<fcel>{i}<fcel>{2 * i}<nl>" for i in range(150)), ROW, TABLE),
        ("x = ", "\\frac{1}{2}+", FORMULA),  # a formula fragment
        ("", "0", TEXT),  # from the first token on
    ],
    ids=["char", "phrase", "line", "table-row", "formula", "from-start"],
)
def test_a_loop_of_each_kind_is_stopped_within_its_span_and_cut_to_one_unit(
    prefix: str, unit: str, limits: Limits
) -> None:
    """The watch stops once the repeats cover the label's span (plus one look's worth), and
    the cut is the text before the loop and the unit once (in the phase the repeats began:
    `… year. lorem ipsum` for `… year. ` and `lorem ipsum `)."""
    text = prefix + unit * 5000
    stopped = stop_point(text, limits)
    assert stopped is not None
    seen, cut = stopped
    need = limits.need(len(unit))
    assert seen <= max(len(prefix) + need + len(unit) + CHECK_EVERY + 3, limits.min_answer + 20)
    assert text.startswith(cut)
    assert len(prefix) < len(cut) <= len(prefix) + len(unit)


def test_a_loop_starting_mid_word_keeps_the_text_before_it_whole() -> None:
    """The text before the loop ends like the unit: the cut keeps it and one unit, as
    "See the" + " tables." (the repeats' phase starts where the text stops differing)."""
    text = "See the tables. tables. tables. " + "tables. " * 300
    stopped = stop_point(text, TEXT)
    assert stopped is not None
    assert stopped[1] == "See the tables."


LEADERS = "\n".join(
    f"{n}.{m} {title} {'.' * (70 - len(title))} {n * 10 + m}"
    for n in range(1, 9)
    for m, title in enumerate(("Scope", "Methods of the survey", "Results", "Notes"), 1)
)
EMPTY_CELLS = "<fcel>Item" + "<fcel>Q1<fcel>Q2<fcel>Q3<fcel>Q4" + "<nl>" + "".join(
    f"<fcel>Line {i}" + "<ecel>" * (3 + i % 2) + ("<fcel>x" if i % 2 == 0 else "") + "<nl>"
    for i in range(60)
) + ("<ecel>" * 5 + "<nl>") * 30  # fmt: skip
NUMBERS = "\n".join(str(n) for n in range(1, 800))
ZEROS = "\\begin{pmatrix}" + " \\\\ ".join(" & ".join(["0"] * 16) for _ in range(16))
ZEROS += "\\end{pmatrix}"
STANDIN_LOOP = " ".join(["paragraph reading order"] * 20)  # a short loop PaddleX cleans up


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        (LEADERS, TEXT),
        (EMPTY_CELLS, TABLE),
        (NUMBERS, TEXT),
        ("\n".join(["0.00"] * 300), TABLE),  # a column of zeros in a table or chart
        (ZEROS, FORMULA),
        (STANDIN_LOOP, TEXT),
        ("=" * 120 + "\n" + "-" * 120, TEXT),  # rules drawn with characters
    ],
    ids=[
        "dotted-leaders",
        "empty-cells",
        "number-column",
        "zero-column",
        "zero-matrix",
        "short-loop",
        "rules",
    ],
)
def test_legitimate_repetition_is_not_a_loop(text: str, limits: Limits) -> None:
    """Contents pages, tables of empty cells, number columns, matrices: never stopped."""
    assert stop_point(text, limits, step=1) is None


def test_a_table_is_not_looked_at_before_paddlexs_5000_characters() -> None:
    """A table whose rows repeat is left alone under 5,000 characters (PaddleX's own floor
    for tables), stopped once it passes it."""
    short = ROW * (4990 // len(ROW))
    assert loops.find(short, TABLE) is None
    assert loops.find(short + ROW * 10, TABLE) == loops.Loop(0, len(ROW))


@pytest.mark.parametrize(
    ("label", "limits"),
    [("text", TEXT), ("table", TABLE), ("chart", TABLE), ("formula", FORMULA), ("seal", TEXT)],
)
def test_each_label_has_its_thresholds(label: str, limits: Limits) -> None:
    """Tables and charts wait for PaddleX's table floor, formulas for a longer span."""
    assert loops.limits(label) == limits


def test_the_cut_is_what_paddlex_keeps_of_a_short_answer_never_more() -> None:
    """Every threshold is at least PaddleX's (50 characters of text, 5,000 of a table): the
    guard never looks at an answer PaddleX would leave alone."""
    for limits in (TEXT, FORMULA):
        assert max(limits.min_answer, limits.span) >= 50
    assert TABLE.min_answer >= 5000
    looping = PREFIX + "…" * 2000
    cut = loops.find(looping, TEXT)
    assert cut is not None
    assert truncate_repetitive(cut.cut(looping), min_count=50) == PREFIX + "…"
