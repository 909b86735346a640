"""The drill itself: capacity, then the mixed open-loop load at a share of it, the fault
schedule and the RSS sampler side by side, then the jobs drained to their end."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from bench.soak import memory
from bench.soak.clients import Clients
from bench.soak.faults import Planned, run_schedule
from bench.soak.inputs import BadInput
from bench.soak.jobs import JobRecord, run_job
from bench.soak.report import Outcome, Window
from bench.soak.stack import Stack

# Shares of the offered pages (chat pages, a document's or job's pages each count): what a
# production day mixes. Bad inputs come on top, at BAD_PER_S: most never reach an engine.
MIX = {"chat": 0.35, "chat-stream": 0.25, "ocr": 0.15, "job": 0.2, "disconnect": 0.05}
OCR_PAGES, JOB_PAGES = 2, 4
BAD_PER_S = 0.5


@dataclass
class Plan:
    """What the drill does, from the command line."""

    seconds: float
    load: float  # share of the measured capacity
    ramp: list[int]  # pages in flight of each capacity step
    ramp_seconds: float
    sample_every: float
    warmup: float
    grace: float
    drain: float
    seed: int


async def capacity(clients: Clients, ramp: list[int], seconds: float) -> list[dict[str, Any]]:
    """Closed-loop chat pages/s through nginx at each step's pages in flight (a short ramp)."""
    steps = []
    for workers in ramp:
        kept = len(clients.outcomes)
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def worker(index: int, deadline: float = deadline) -> None:
            for seed in itertools.count(index * 1000):
                if time.monotonic() >= deadline:
                    return
                await clients.chat(seed, stream=False)

        await asyncio.gather(*(worker(i) for i in range(workers)))
        done = clients.outcomes[kept:]
        del clients.outcomes[kept:]  # the ramp is not part of the soak's record
        rate = sum(o.ok for o in done) / (time.monotonic() - started)
        failed = sum(not o.ok for o in done)
        steps.append({"in_flight": workers, "pages_per_s": rate, "failed": failed})
        print(f"capacity step: {workers} in flight -> {rate:.2f} pages/s", flush=True)
    return steps


async def _arrivals(
    rate: float, until: float, clients: Clients, *, seed: float, start: Any,
    tasks: set[asyncio.Task[None]],
) -> None:  # fmt: skip
    """Poisson arrivals at `rate`/s until run second `until`; each calls `start(n)`. The first
    comes at once, so that every kind of client runs however short the drill (at a job's rate of
    ~0.1/s, a 45 s drill otherwise had no job about once in ten runs)."""
    if rate <= 0:
        return
    chance = random.Random(seed)  # noqa: S311 (arrival times, not secrets)
    for n in itertools.count():
        # a long gap must not hold the load past its end
        gap = chance.expovariate(rate) if n else 0.0
        await asyncio.sleep(min(gap, max(until - clients.now(), 0)))
        if clients.now() >= until:
            return
        task = asyncio.create_task(start(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def soak(
    stack: Stack, clients: Clients, plan: Plan, *, schedule: list[Planned],
    documents: dict[str, bytes], bad: list[BadInput],
) -> dict[str, Any]:  # fmt: skip
    """Run the load, faults and sampler for `plan.seconds`; drain; everything recorded."""
    steps = await capacity(clients, plan.ramp, plan.ramp_seconds)
    best = max(step["pages_per_s"] for step in steps)
    pages_per_s = best * plan.load
    print(f"offered load: {pages_per_s:.2f} pages/s ({plan.load:.0%} of {best:.2f})", flush=True)
    clients.origin = time.monotonic()
    windows: list[Window] = []
    rss: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
    records: list[JobRecord] = []
    tasks: set[asyncio.Task[None]] = set()
    chance = random.Random(plan.seed)  # noqa: S311 (arrival times, not secrets)
    until, deadline = plan.seconds, plan.seconds + plan.drain
    starts = {
        "chat": lambda n: clients.chat(n, stream=False),
        "chat-stream": lambda n: clients.chat(n, stream=True),
        "ocr": lambda n: clients.document(documents["ocr"], OCR_PAGES),
        "job": lambda n: run_job(clients, documents["job"], JOB_PAGES, records, deadline),
        "disconnect": clients.disconnect,
    }
    per_request = {"ocr": OCR_PAGES, "job": JOB_PAGES}
    loads = [
        _arrivals(pages_per_s * share / per_request.get(kind, 1), until, clients,
                  seed=chance.random(), start=starts[kind], tasks=tasks)
        for kind, share in MIX.items()
    ]  # fmt: skip
    loads.append(
        _arrivals(BAD_PER_S, until, clients, seed=chance.random(),
                  start=lambda n: clients.bad(bad[n % len(bad)]), tasks=tasks)
    )  # fmt: skip

    async def sampler() -> None:
        while True:
            memory.sample(stack.parts, clients.now(), rss)
            await asyncio.sleep(plan.sample_every)

    sampling = asyncio.create_task(sampler())
    faults = asyncio.create_task(
        run_schedule(stack, schedule, plan.seconds, clients.now, grace=plan.grace, windows=windows)
    )
    await asyncio.gather(*loads)
    print(f"[{clients.now():7.1f}s] load over; draining {len(tasks)} requests and jobs", flush=True)
    await faults
    while tasks and clients.now() < deadline + 60:
        await asyncio.wait(set(tasks), timeout=5)
    sampling.cancel()
    return {
        "capacity": {"steps": steps, "best_pages_per_s": best, "offered_pages_per_s": pages_per_s},
        "windows": windows,
        "outcomes": clients.outcomes,
        "rss": dict(rss),
        "jobs": [asdict(record) for record in records],
        "unfinished_tasks": len(tasks),
        "drained_at": clients.now(),
    }


def ended_outcomes(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """Requests per kind: how many, how many ended well."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "ok": 0})
    for outcome in outcomes:
        table[outcome.kind]["sent"] += 1
        table[outcome.kind]["ok"] += outcome.ok
    return dict(table)
