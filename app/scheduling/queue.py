"""The admission queue: bounded, and fair across API keys (round-robin, FIFO within a key).

Two lanes: interactive requests, and the background lane (document job pages, marked by
`BACKGROUND` in the task that asks). A freed slot goes to the background lane only when no
interactive request waits, so an interactive request waits behind the job pages already in
flight, never behind queued ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from app.backends import Backend
from app.scheduling.capacity import PAGE, Work

T = TypeVar("T")
BACKGROUND: ContextVar[bool] = ContextVar("ocrvl_background_lane", default=False)
"""True in a task whose requests take the background lane (the job runner sets it)."""


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request: what it asks for, and the future its backend is handed through."""

    key: str
    model: str
    granted: asyncio.Future[Backend] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    since: float = field(default_factory=time.monotonic)
    background: bool = field(default_factory=BACKGROUND.get)
    work: Work = field(default_factory=lambda: PAGE)


class FairQueue:
    """Waiters by key; the next one served is from the key served longest ago.

    So a key with 200 pages queued and a key with one page alternate: the single page waits
    behind at most one page of every other waiting key, not behind the whole batch.
    """

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, deque[Waiter]] = OrderedDict()  # interactive
        self._background: OrderedDict[str, deque[Waiter]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _lane(self, waiter: Waiter) -> OrderedDict[str, deque[Waiter]]:
        return self._background if waiter.background else self._by_key

    def push(self, waiter: Waiter) -> None:
        """Queue `waiter` behind its own key's earlier waiters (in its lane)."""
        self._lane(waiter).setdefault(waiter.key, deque()).append(waiter)
        self._size += 1

    def remove(self, waiter: Waiter) -> None:
        """Take `waiter` out (it gave up or left); no-op if it is no longer queued."""
        lane = self._lane(waiter)
        waiters = lane.get(waiter.key)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self._size -= 1
        if not waiters:
            del lane[waiter.key]

    def pop_first(self, grant: Callable[[Waiter], T | None]) -> tuple[Waiter, T] | None:
        """Serve the first waiter, in fair order, for which `grant` finds something: every
        interactive key's oldest waiter in turn, then the background lane's; the key served
        goes to the back of its lane."""
        for lane in (self._by_key, self._background):
            for key in list(lane):
                waiter = lane[key][0]
                given = grant(waiter)
                if given is None:
                    continue
                lane[key].popleft()
                self._size -= 1
                if lane[key]:
                    lane.move_to_end(key)
                else:
                    del lane[key]
                return waiter, given
        return None

    def ahead_of(self, key: str) -> int:
        """Waiters a new request of `key` would wait behind, at worst (one round of every
        other key per waiter of its own, bounded by the queue length); an interactive request
        counts no background waiter, a background one every interactive waiter."""
        background = BACKGROUND.get()
        lane = self._background if background else self._by_key
        own = len(lane.get(key, ()))
        others = sum(min(len(w), own + 1) for k, w in lane.items() if k != key)
        interactive = sum(len(w) for w in self._by_key.values()) if background else 0
        return own + others + interactive

    def background_waiting(self) -> int:
        """Job pages waiting in the background lane."""
        return sum(len(waiters) for waiters in self._background.values())

    def __iter__(self) -> Iterator[Waiter]:
        for lane in (self._by_key, self._background):
            for waiters in lane.values():
                yield from waiters
