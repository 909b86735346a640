"""Service times: how long each backend holds a slot, and so how fast a full queue drains.

A full backend frees a slot every `service time ÷ capacity` seconds on average (Little's law),
so the queue drains at the sum of `capacity ÷ service time` over the backends serving a model.
That is a property of the backends, not of the last few seconds' traffic: after a quiet spell
the figure is the same as in the middle of a busy hour, where a rate of recent completions
would say "one page in half a minute" and shed a burst the backends could serve at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from app.backends import Backend

SAMPLES = 64  # the most recent slot holds per backend behind its mean service time


class ServiceTimes:
    """The recent slot hold times (seconds) of every backend, by URL."""

    def __init__(self) -> None:
        self._held: dict[str, deque[float]] = {}

    def record(self, backend: Backend, seconds: float) -> None:
        """A request on `backend` held its slot for `seconds`."""
        held = self._held.get(backend.url)
        if held is None:
            held = self._held[backend.url] = deque(maxlen=SAMPLES)
        held.append(max(seconds, 0.0))

    def mean(self, backend: Backend) -> float | None:
        """`backend`'s mean service time over its recent requests, if it has served any."""
        held = self._held.get(backend.url)
        return sum(held) / len(held) if held else None

    def drain_rate(
        self, backends: Iterable[Backend], capacity: Callable[[Backend], int]
    ) -> float | None:
        """Requests per second `backends` finish while full, or None before any has served.

        A backend that has not served yet is counted at the others' mean service time: it
        takes waiters as soon as it is healthy, so leaving it out would shed too early.
        """
        backends = list(backends)
        means = {b.url: self.mean(b) for b in backends}
        known = [m for m in means.values() if m is not None]
        if not known:
            return None
        typical = sum(known) / len(known)
        rate = 0.0
        for b in backends:
            seconds = means[b.url] or typical
            # a request answered within a millisecond says nothing of the engine's pace
            rate += capacity(b) / max(seconds, 1e-3)
        return rate
