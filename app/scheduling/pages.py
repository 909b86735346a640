"""Requests that weigh more than one page: `n` > 1 sequences decoded together (app/policy.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from app.scheduling.admission import Lease, Scheduler


@dataclass(slots=True, eq=False)
class WideLease(Lease):
    """The slots of a request of `n` > 1 sequences: its own and `extra` more on the same backend,
    where all n run together. They are taken as it is admitted on one free slot, so the backend
    may run up to n - 1 past its capacity meanwhile (vLLM queues those itself) rather than
    hold slots while waiting for more, which could leave two such requests waiting on each other.
    """

    extra: int = 0

    def release(self) -> None:
        """Give all of its slots back (idempotent)."""
        if not self.released:
            held = time.monotonic() - self.since  # each of the n ran as long as the answer
            for _ in range(self.extra):
                self._scheduler.release(self.backend, held=held)
        Lease.release(self)


def widened(lease: Lease, scheduler: Scheduler, pages: int) -> Lease:
    """`lease`, holding `pages` slots on its backend (`n` > 1 counts as n pages)."""
    if pages <= 1:
        return lease
    lease.backend.in_flight += pages - 1
    return WideLease(
        lease.backend, scheduler, background=lease.background, extra=pages - 1
    )  # takes over lease's own slot
