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
from typing import Any

import httpx
import orjson

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
    """One mode at one concurrency: both paths' latencies, CPU use and the gateway's own view.

    `chunks`: the tokens the stand-in streams per request in the sse mode (0 in the others).
    """

    mode: str
    concurrency: int
    batch: int
    rounds: int
    chunks: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TARGETS, 0.0))
    cpu: dict[str, dict[str, float]] = field(
        default_factory=lambda: {t: dict.fromkeys(PROCESSES, 0.0) for t in TARGETS}
    )
    self_measured: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])

    @classmethod
    def planned(cls, mode: str, concurrency: int, requests: int, chunks: int = 0) -> Cell:
        """A cell of at least `requests` per path in about 8 batches, each 2 or more waves deep."""
        batch = max(2 * concurrency, math.ceil(requests / 8))
        rounds = math.ceil(requests / batch)
        return cls(mode, concurrency, batch, rounds + rounds % 2, chunks)  # even: ABBA balanced


def payloads(
    page: dict[str, Any], modes: list[str], chunks: list[int]
) -> list[tuple[str, int, bytes]]:
    """(mode, chunks, body) of each kind of cell: `json` the page as PaddleOCR's client sends
    it, `stream` the same streamed, `sse` streamed with `ignore_eos` so the stand-in sends
    exactly `max_completion_tokens` chunks, once per count in `chunks`."""
    kinds = []
    for mode in modes:
        if mode == "json":
            kinds.append((mode, 0, orjson.dumps(page)))
        elif mode == "stream":
            kinds.append((mode, 0, orjson.dumps(page | {"stream": True})))
        elif mode == "sse":
            for count in chunks:
                tokens = {"stream": True, "ignore_eos": True, "max_completion_tokens": count}
                kinds.append((mode, count, orjson.dumps(page | tokens)))
        else:
            raise ValueError(f"unknown mode {mode!r}: json, stream or sse")
    return kinds


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
    warm_up = 2 * cell.concurrency if cell.chunks else max(2 * cell.concurrency, 20)
    for target in targets.values():
        await run_batch(target, body, warm_up, cell.concurrency)
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
    servers: Servers,
    kinds: list[tuple[str, int, bytes]],
    concurrencies: list[int],
    requests: dict[str, int],
) -> list[Cell]:
    """Every kind of cell (`payloads`) at every concurrency, against both paths; `requests`
    per path by mode. One concurrency's cells all run before the next concurrency's: a c=1
    cell run after a c=32 one measured up to 40 % more gateway CPU per request, or less under
    glibc's 128 KiB mmap threshold (the keep-alive connections and heap blocks a burst leaves
    behind), so the order would decide the comparison; the sse cells follow each other (their
    difference is the cost of the chunks)."""
    metrics = f"{servers.gateway}/metrics"
    order = [(kind, concurrency) for concurrency in concurrencies for kind in kinds]
    async with connected(servers, max(concurrencies)) as targets:
        cells = []
        for (mode, chunks, payload), concurrency in order:
            cell = Cell.planned(mode, concurrency, requests[mode], chunks)
            cells.append(await measure(targets, metrics, servers.pids, payload, cell))
            shown = f"{mode} ({chunks} chunks)" if chunks else mode
            print(f"  measured {shown} c={concurrency}", file=sys.stderr)
        return cells
