"""The admission queue: bounded, and fair across API keys (round-robin, FIFO within a key)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from app.backends import Backend

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Waiter:
    """One queued request: what it asks for, and the future its backend is handed through."""

    key: str
    model: str
    granted: asyncio.Future[Backend] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    since: float = field(default_factory=time.monotonic)


class FairQueue:
    """Waiters by key; the next one served is from the key served longest ago.

    So a key with 200 pages queued and a key with one page alternate: the single page waits
    behind at most one page of every other waiting key, not behind the whole batch.
    """

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, deque[Waiter]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, waiter: Waiter) -> None:
        """Queue `waiter` behind its own key's earlier waiters."""
        self._by_key.setdefault(waiter.key, deque()).append(waiter)
        self._size += 1

    def remove(self, waiter: Waiter) -> None:
        """Take `waiter` out (it gave up or left); no-op if it is no longer queued."""
        waiters = self._by_key.get(waiter.key)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self._size -= 1
        if not waiters:
            del self._by_key[waiter.key]

    def pop_first(self, grant: Callable[[Waiter], T | None]) -> tuple[Waiter, T] | None:
        """Serve the first waiter, in fair order, for which `grant` finds something.

        `grant` is asked for each key's oldest waiter in turn; the key served goes to the back.
        """
        for key in list(self._by_key):
            waiter = self._by_key[key][0]
            given = grant(waiter)
            if given is None:
                continue
            self._by_key[key].popleft()
            self._size -= 1
            if self._by_key[key]:
                self._by_key.move_to_end(key)
            else:
                del self._by_key[key]
            return waiter, given
        return None

    def ahead_of(self, key: str) -> int:
        """Waiters a new request of `key` would wait behind, at worst (one round of every
        other key per waiter of its own, bounded by the queue length)."""
        own = len(self._by_key.get(key, ()))
        others = sum(min(len(w), own + 1) for k, w in self._by_key.items() if k != key)
        return own + others

    def __iter__(self) -> Iterator[Waiter]:
        for waiters in self._by_key.values():
            yield from waiters
