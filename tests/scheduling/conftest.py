"""A scheduler over hand-made backends: the admission rules without HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.backends import Backend, BackendPool
from app.metrics import Metrics
from app.scheduling import Scheduler

MODEL = "paddleocr-vl"


def backend(url: str, capacity: int | None = 1, **fields: object) -> Backend:
    """A healthy backend serving MODEL."""
    made = Backend(url, healthy=True, models={MODEL: {"id": MODEL}}, capacity=capacity, problem="")
    for name, value in fields.items():
        setattr(made, name, value)
    return made


@pytest.fixture
async def pool() -> AsyncIterator[BackendPool]:
    """An empty pool; tests put their backends in `pool.backends`."""
    async with httpx.AsyncClient() as client:
        yield BackendPool([], client, {}, timeout=1)


def scheduler_for(pool: BackendPool, **options: object) -> Scheduler:
    """A Scheduler with admission on, a queue of 100 and a 5 s queue timeout unless given."""
    settings: dict[str, object] = {
        "enabled": True,
        "queue_size": 100,
        "queue_timeout": 5.0,
        **options,
    }
    return Scheduler(pool, Metrics(), **settings)  # type: ignore[arg-type]
