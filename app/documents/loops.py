"""The loop detector: does an answer, as it arrives, end in a repetition loop, and where to cut it.

PaddleOCR-VL now and then falls into a loop (`……` to the token limit, a line or a table row
over and over, a formula fragment again and again). A loop is the answer's tail repeating one
unit exactly: a unit of `size` characters, repeated until the repeated part covers `span`
characters, at least `repeats` times (`long_repeats` for a unit of `long_unit` characters or
more: a repeated line is a loop sooner than a repeated word). The cut keeps the text before the
loop and one occurrence of the unit.

Thresholds per label (`limits`), each no bolder than PaddleX's own clean-up
(`truncate_repetitive_content`: nothing under 50 characters for text, 5,000 for a table, and then
a tail that repeats a unit 5 or 10 times), and large enough that legitimate repetition is not a
loop (tests/documents/test_loops.py): dotted leaders of a contents page (a line's width of dots,
well under `span`), number columns (not exact repeats), runs of empty table cells (`<ecel>` in
OTSL: a table must be 5,000 characters long before its tail may loop, as PaddleX has it).
"""

from __future__ import annotations

from dataclasses import dataclass

STOPPED = "repetition"  # a stopped answer's finish_reason and `stopped` field
CHECK_EVERY = 16  # characters between two looks at the tail (a look costs a few compares)
PROBE = 8  # the tail's last characters whose earlier places give the candidate unit sizes


@dataclass(frozen=True, slots=True)
class Limits:
    """When an answer's tail is a loop."""

    span: int  # characters the repeated tail must cover
    repeats: int = 10  # repeats of a short unit
    long_unit: int = 64  # from this unit size on, `long_repeats` repeats suffice
    long_repeats: int = 5
    max_unit: int = 512  # the longest unit looked for (a long line)
    min_answer: int = 50  # the answer's length before any look (PaddleX: 50 text, 5,000 table)

    def need(self, size: int) -> int:
        """The characters of tail a unit of `size` must repeat over to be a loop."""
        repeats = self.repeats if size < self.long_unit else self.long_repeats
        return max(self.span, size * repeats)


TEXT = Limits(span=640)  # ~160 tokens of English, 640 of `…`: a line of dots is under 200
FORMULA = Limits(span=1500)  # a zero matrix's `0 & 0 & …` is legitimate for a while
TABLE = Limits(span=2000, max_unit=1024, min_answer=5000)  # OTSL rows; PaddleX's 5,000 floor
BY_LABEL = {"table": TABLE, "chart": TABLE, "formula": FORMULA, "display_formula": FORMULA}
BY_TASK = {"table": TABLE, "chart": TABLE, "formula": FORMULA}  # a whole page, by its task


def limits(label: str) -> Limits:
    """The thresholds for a block's label (a whole page: its task, which names the same)."""
    return BY_LABEL.get(label, TEXT)


@dataclass(frozen=True, slots=True)
class Loop:
    """Where an answer's loop starts and the size of its repeated unit (in characters)."""

    start: int
    size: int

    def cut(self, text: str) -> str:
        """`text` up to the loop and one occurrence of its unit."""
        return text[: self.start + self.size]


def find(text: str, limits: Limits) -> Loop | None:
    """The loop `text` ends in, if it ends in one: the smallest unit that repeats enough.

    A unit of `size` repeats only where the last PROBE characters also stand `size` earlier;
    those places are found by `str.rfind` (C speed), nearest first, and only they are checked.
    """
    n = len(text)
    if n < max(limits.min_answer, limits.span, PROBE):
        return None
    tail = n - PROBE
    probe = text[tail:]
    lowest = max(tail - limits.max_unit, 0)
    at = tail
    while (at := text.rfind(probe, lowest, at + PROBE - 1)) >= 0:
        size = tail - at
        need = limits.need(size)
        if need <= n and text[n - need + size :] == text[n - need : n - size]:
            return Loop(_start(text, n - need, size), size)
    return None


def _start(text: str, start: int, size: int) -> int:
    """The first character from which `text` repeats with period `size` to its end."""
    while start > 0 and text[start - 1] == text[start - 1 + size]:
        start -= 1
    return start


class Watch:
    """Looks at an answer's tail as it grows, every CHECK_EVERY characters."""

    __slots__ = ("_checked", "limits", "loop")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.loop: Loop | None = None
        self._checked = 0

    def sees_loop(self, text: str) -> bool:
        """Whether `text` (the answer so far) now ends in a loop (kept in `loop`)."""
        if len(text) - self._checked < CHECK_EVERY:
            return False
        self._checked = len(text)
        self.loop = find(text, self.limits)
        return self.loop is not None
