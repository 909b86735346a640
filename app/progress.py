"""The progress bar `ocrvl ocr` draws on a terminal, with and without `--job`."""

from __future__ import annotations

import time
from typing import IO


class Progress:
    """`name [#####-----] 3/5 pages  1.2 pages/s` on a terminal; nothing otherwise."""

    WIDTH = 24

    def __init__(self, name: str, stream: IO[str]) -> None:
        self.name, self.stream = name, stream
        self.enabled = stream.isatty()
        self.total = self.done = self.failed = 0
        self.started = time.monotonic()

    def start(self, total: int) -> None:
        """The page count is known."""
        self.total, self.started = total, time.monotonic()
        self._draw()

    def step(self, failed: bool) -> None:
        """One more page is back."""
        self.done += 1
        self.failed += failed
        self._draw()

    def finish(self) -> None:
        """End the bar's line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.started, 1e-6)
        filled = self.WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        failed = f"  {self.failed} failed" if self.failed else ""
        self.stream.write(
            f"\r{self.name} [{bar}] {self.done}/{self.total} pages  "
            f"{self.done / elapsed:.2f} pages/s{failed}"
        )
        self.stream.flush()
