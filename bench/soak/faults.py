"""The fault schedule and the faults: each one done by PID, its window closed once the part
is healthy again (plus a grace for the gateways' health probes to see it)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from bench.soak.report import Window
from bench.soak.stack import Part, Stack, nginx_reload

FAULTS = ("engine-kill", "redis-restart", "gateway-kill", "nginx-reload")
DEFAULT_SCHEDULE = "engine-kill:0.15,redis-restart:0.35,gateway-kill:0.55,nginx-reload:0.75"


@dataclass(frozen=True)
class Planned:
    """A fault and when it happens, as a fraction of the run."""

    fault: str
    at: float


def parse_schedule(text: str) -> list[Planned]:
    """`FAULT:FRACTION,...` (fractions of the run, 0-1); ValueError naming a bad entry."""
    planned = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        fault, _, at = entry.partition(":")
        try:
            fraction = float(at)
        except ValueError:
            fraction = -1.0
        if fault not in FAULTS or not 0 <= fraction < 1:
            raise ValueError(f"schedule entry {entry!r}: expected one of {FAULTS}:FRACTION (0-1)")
        planned.append(Planned(fault, fraction))
    return sorted(planned, key=lambda p: p.at)


SENTINEL = "ocrvl-soak:sentinel"
"""A key the drill writes just before it stops Redis and reads once it is back: DBSIZE alone
cannot show the data was kept, since the gateways' own keys (concurrency slots, request
windows with their TTLs) come and go with the traffic in between."""


def _redis(part: Part, *args: str) -> str:
    """One redis-cli command against the drill's Redis; its reply."""
    port = part.command[part.command.index("--port") + 1]
    password = part.command[part.command.index("--requirepass") + 1]
    result = subprocess.run(
        ["redis-cli", "-p", port, "--no-auth-warning", "-a", password, *args],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    return result.stdout.strip()


def _redis_keys(part: Part) -> int:
    """DBSIZE of the drill's Redis."""
    return int(_redis(part, "DBSIZE") or -1)


def act(stack: Stack, fault: str, count: int, now: Callable[[], float], grace: float) -> Window:
    """Do `fault` (blocking: run it in a thread); its window, closed when healthy again."""
    if fault == "engine-kill":
        engines = stack.of_kind("engine")
        part = engines[count % len(engines)]
    elif fault == "gateway-kill":
        gateways = stack.of_kind("gateway")
        part = gateways[count % len(gateways)]
    else:
        part = stack.named("redis" if fault == "redis-restart" else "nginx")
    window = Window(fault, part.name, now(), grace=grace)
    window.notes["pid_before"] = part.pid
    if fault == "nginx-reload":
        nginx_reload(part)
        time.sleep(1)  # the new workers take over; the old ones finish what they hold
        window.healthy_at = now() if part.ready() else None
        return window
    token = uuid.uuid4().hex
    if fault == "redis-restart":
        _redis(part, "SET", SENTINEL, token)
        window.notes["keys_before"] = _redis_keys(part)
        part.stop()  # SIGTERM: Redis writes its append-only file and exits
    else:
        part.kill()  # SIGKILL, as a crash
    try:
        window.notes["restart_s"] = round(part.start(), 1)
    except RuntimeError as exc:  # it never came back: the window stays open, the report says why
        window.notes["error"] = str(exc)[:500]
        return window
    window.healthy_at = now()
    window.notes["pid_after"] = part.pid
    if fault == "redis-restart":
        window.notes["keys_after"] = _redis_keys(part)
        window.notes["data_kept"] = _redis(part, "GET", SENTINEL) == token
    return window


async def run_schedule(
    stack: Stack, planned: list[Planned], seconds: float, now: Callable[[], float], *,
    grace: float, windows: list[Window],
) -> None:  # fmt: skip
    """Do each planned fault at its time; its window goes into `windows` as it opens."""
    counts: dict[str, int] = {}
    for item in planned:
        await asyncio.sleep(max(item.at * seconds - now(), 0))
        count = counts.get(item.fault, 0)
        counts[item.fault] = count + 1
        print(f"[{now():7.1f}s] fault: {item.fault}", flush=True)
        window = await asyncio.to_thread(act, stack, item.fault, count, now, grace)
        windows.append(window)
        print(f"[{now():7.1f}s] healthy again: {window.label} {window.notes}", flush=True)
