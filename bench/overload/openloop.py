"""Load: a closed loop (for the unloaded latency and the peak), and open-loop Poisson arrivals
at an offered rate (what overload looks like: clients do not slow down when the server does)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx
import orjson

from bench.overload.servers import CLIENT_KEY, SERVED


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: when it was sent, how long it took, what it got."""

    sent: float
    seconds: float
    status: int  # 0: the connection failed
    code: str | None  # the error body's `code`
    retry_after: str | None


def body(tokens: int) -> bytes:
    """A page that generates exactly `tokens` tokens (ignore_eos: the tiny model's answers are
    random, so without it a request's length would be too)."""
    return orjson.dumps(
        {
            "model": SERVED,
            "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
    )


async def one(client: httpx.AsyncClient, payload: bytes) -> Outcome:
    """Send one request and note the outcome."""
    sent = time.monotonic()
    try:
        response = await client.post("/v1/chat/completions", content=payload)
    except httpx.HTTPError:
        return Outcome(sent, time.monotonic() - sent, 0, "transport", None)
    code = None
    if response.status_code != 200:
        try:
            code = orjson.loads(response.content)["error"]["code"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            code = None
    retry_after = response.headers.get("retry-after")
    return Outcome(sent, time.monotonic() - sent, response.status_code, code, retry_after)


def client(url: str) -> httpx.AsyncClient:
    """A keep-alive client with room for every request in flight."""
    return httpx.AsyncClient(
        base_url=url,
        headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
        timeout=300,
        limits=httpx.Limits(max_connections=2000, max_keepalive_connections=2000),
    )


async def closed_loop(url: str, concurrency: int, seconds: float, payload: bytes) -> list[Outcome]:
    """`concurrency` requests in flight at all times for `seconds`."""
    outcomes: list[Outcome] = []
    stop = time.monotonic() + seconds
    async with client(url) as http:

        async def worker() -> None:
            while time.monotonic() < stop:
                outcomes.append(await one(http, payload))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


async def open_loop(
    url: str, rate: float, seconds: float, payload: bytes, seed: int
) -> list[Outcome]:
    """Poisson arrivals at `rate` per second for `seconds`; waits for every answer."""
    rng = random.Random(seed)  # noqa: S311 (arrival times, not secrets)
    tasks: list[asyncio.Task[Outcome]] = []
    async with client(url) as http:
        start = time.monotonic()
        due = start
        while True:
            due += rng.expovariate(rate)
            if due - start > seconds:
                break
            await asyncio.sleep(max(due - time.monotonic(), 0))
            tasks.append(asyncio.create_task(one(http, payload)))
        return list(await asyncio.gather(*tasks))
