"""A progress bar per level on a terminal; one summary line per level otherwise."""

from __future__ import annotations

import time
from typing import TextIO

from app.bench.load import Outcome

WIDTH = 24


class Progress:
    """Draws one level's bar on `stream` at most 10 times a second."""

    def __init__(
        self, stream: TextIO, title: str, requests: int | None, duration: float | None
    ) -> None:
        self.stream, self.title = stream, title
        self.requests, self.duration = requests, duration
        self.tty = stream.isatty()
        self.began = time.perf_counter()
        self.drawn = 0.0

    def update(self, outcomes: list[Outcome]) -> None:
        """Redraw the bar (a terminal only) for the outcomes measured so far."""
        now = time.perf_counter()
        if not self.tty or now - self.drawn < 0.1:
            return
        self.drawn = now
        elapsed = now - self.began
        if self.requests:
            done = len(outcomes) / self.requests
        else:
            done = elapsed / self.duration if self.duration else 0.0
        filled = round(min(done, 1.0) * WIDTH)
        ok = sum(o.ok for o in outcomes)
        errors = len(outcomes) - ok
        bar = "#" * filled + "." * (WIDTH - filled)
        line = f"\r{self.title} [{bar}] {len(outcomes)} done, {ok / elapsed:.2f} pages/s"
        self.stream.write(line + (f", {errors} errors" if errors else "") + "\x1b[K")
        self.stream.flush()

    def close(self, summary: str) -> None:
        """Replace the bar with the level's summary line."""
        prefix = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{prefix}{self.title} {summary}\n")
        self.stream.flush()
