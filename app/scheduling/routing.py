"""Which backend takes a page: the least loaded one that has a free slot."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from app.backends import Backend


def load(backend: Backend, now: float) -> int:
    """Pages the backend is working on: the gateway's own count, or the engine's if larger
    (other gateways' requests, and pages vLLM still holds after a client left)."""
    engine = backend.engine
    if engine is not None and engine.fresh(now):
        return max(backend.in_flight, engine.running + engine.waiting)
    return backend.in_flight


class Router:
    """Orders backends by load relative to capacity, then KV cache use; ties rotate."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def rank(self, backends: Sequence[Backend], capacity: dict[str, int]) -> list[Backend]:
        """`backends`, least loaded first (a backend with no engine reading uses in-flight)."""
        if len(backends) < 2:
            return list(backends)
        now = time.monotonic()
        shift = next(self._turn) % len(backends)
        rotated = [*backends[shift:], *backends[:shift]]

        def score(backend: Backend) -> tuple[float, float]:
            engine = backend.engine
            kv = engine.kv_usage if engine is not None and engine.fresh(now) else 0.0
            return load(backend, now) / capacity[backend.url], kv

        return sorted(rotated, key=score)  # stable: equal scores keep the rotation
