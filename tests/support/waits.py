"""Waiting for a state, never for a time: a test polls what it waits for, to a deadline
generous on a loaded 2-core CI machine, and fails saying what never came."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from tests.support.prometheus import metric

WAIT = 15.0  # seconds: what a test waits for here comes within milliseconds when all is well


async def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Return once `condition()` holds (looked at between loop steps); a failed assertion
    saying `what` if it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (waited {timeout:g} s)"
        await asyncio.sleep(0.01)


async def until_metric(
    client: httpx.AsyncClient, name: str, value: float, timeout: float = 30.0, **labels: str
) -> float:
    """Wait until `client`'s /metrics shows `name` (with `labels`) at `value`; return it."""
    deadline = time.monotonic() + timeout
    while (seen := metric((await client.get("/metrics")).text, name, **labels)) != value:
        assert time.monotonic() < deadline, f"{name} read {seen}, never {value}, in {timeout:g} s"
        await asyncio.sleep(0.05)
    return seen
