"""The load: batches of requests on both paths, alternated ABBA and measured into cells."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from bench.overhead import BACKEND_KEY, CLIENT_KEY, PROCESSES, ROUTE, TARGET_P50, TARGETS
from bench.overhead.processes import Servers, cpu_seconds

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Target:
    """One way to the backend: its chat URL, headers and keep-alive client."""

    url: str
    headers: dict[str, str]
    client: httpx.AsyncClient


@dataclass
class Cell:
    """One mode at one concurrency: both paths' latencies, CPU use and the gateway's own view."""

    mode: str
    concurrency: int
    batch: int
    rounds: int
    latencies: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0.0))
    cpu: dict[str, dict[str, float]] = field(
        default_factory=lambda: {t: dict.fromkeys(PROCESSES, 0.0) for t in TARGETS}
    )
    self_measured: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    @classmethod
    def planned(cls, mode: str, concurrency: int, requests: int) -> Cell:
        """A cell of at least `requests` per path in about 8 batches, each 2 or more waves deep."""
        batch = max(2 * concurrency, math.ceil(requests / 8))
        rounds = math.ceil(requests / batch)
        return cls(mode, concurrency, batch, rounds + rounds % 2)  # even: ABBA ends balanced


@contextlib.asynccontextmanager
async def connected(servers: Servers, connections: int) -> AsyncIterator[dict[str, Target]]:
    """A keep-alive client per path with that path's chat URL and key; closed at the end."""
    limits = httpx.Limits(max_connections=connections, keepalive_expiry=60)
    ways = {"direct": (servers.backend, BACKEND_KEY), "gateway": (servers.gateway, CLIENT_KEY)}
    async with contextlib.AsyncExitStack() as stack:
        targets = {}
        for name, (base, key) in ways.items():
            client = httpx.AsyncClient(limits=limits, timeout=60, trust_env=False)
            headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
            url = f"{base}{ROUTE}"
            targets[name] = Target(url, headers, await stack.enter_async_context(client))
        yield targets


async def run_batch(
    target: Target, body: bytes, count: int, concurrency: int
) -> tuple[list[float], float]:
    """Send `count` requests, `concurrency` at a time; their latencies and the batch's seconds."""
    latencies: list[float] = []
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            async with target.client.stream(
                "POST", target.url, content=body, headers=target.headers
            ) as response:
                async for _ in response.aiter_raw():
                    pass
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"{target.url} answered {response.status_code}")

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - began


def overhead_histogram(text: str) -> tuple[float, float, float]:
    """(sum, count, count at or under 1 ms) of the chat route's gateway-overhead histogram."""
    found = {"sum": 0.0, "count": 0.0, "fast": 0.0}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or not match[1].startswith("ocrvl_gateway_overhead_seconds"):
            continue
        labels = dict(LABEL.findall(match[2]))
        if labels.get("route") != ROUTE:
            continue
        kind = match[1].rsplit("_", 1)[1]
        if kind in ("sum", "count"):
            found[kind] = float(match[3])
        elif kind == "bucket" and float(labels["le"]) == TARGET_P50:
            found["fast"] = float(match[3])
    return found["sum"], found["count"], found["fast"]


async def scrape(client: httpx.AsyncClient, metrics: str) -> tuple[float, float, float]:
    """The gateway's overhead histogram as its /metrics shows it now."""
    response = await client.get(metrics)
    return overhead_histogram(response.text)


async def measure(
    targets: dict[str, Target], metrics: str, pids: dict[str, int], body: bytes, cell: Cell
) -> Cell:
    """Warm both paths up, then alternate direct and gateway batches (ABBA)."""
    for target in targets.values():
        await run_batch(target, body, max(2 * cell.concurrency, 20), cell.concurrency)
    gateway = targets["gateway"].client
    for turn in range(cell.rounds):
        for name in TARGETS if turn % 2 == 0 else TARGETS[::-1]:
            before = await scrape(gateway, metrics) if name == "gateway" else None
            cpu_before = cpu_seconds(pids)
            latencies, seconds = await run_batch(targets[name], body, cell.batch, cell.concurrency)
            cpu_after = cpu_seconds(pids)
            cell.latencies[name] += latencies
            cell.seconds[name] += seconds
            for process in PROCESSES:
                cell.cpu[name][process] += cpu_after[process] - cpu_before[process]
            if before is not None:
                after = await scrape(gateway, metrics)
                for i, (old, new) in enumerate(zip(before, after, strict=True)):
                    cell.self_measured[i] += new - old
    return cell


async def measure_all(
    servers: Servers, body: bytes, modes: list[str], concurrencies: list[int], requests: int
) -> list[Cell]:
    """Every mode at every concurrency, against both paths."""
    metrics = f"{servers.gateway}/metrics"
    async with connected(servers, max(concurrencies)) as targets:
        cells = []
        for mode in modes:
            payload = body if mode == "json" else body[:-1] + b',"stream":true}'
            for concurrency in concurrencies:
                cell = Cell.planned(mode, concurrency, requests)
                cells.append(await measure(targets, metrics, servers.pids, payload, cell))
                print(f"  measured {mode} c={concurrency}", file=sys.stderr)
        return cells
