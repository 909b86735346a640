"""RSS of each part of the stack over time: /proc/PID/status VmRSS of its process and of
every process under it (a gateway's page workers, nginx's workers), summed."""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from pathlib import Path

from bench.soak.stack import Part


def _parents() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(entry.path, "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children[parent].append(int(entry.name))
    return children


def vm_rss(pid: int) -> int:
    """VmRSS of `pid` in bytes (0 if it has gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss(pid: int, children: dict[int, list[int]]) -> int:
    """RSS of `pid` and every process below it."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += vm_rss(current)
        todo.extend(children.get(current, ()))
    return total


def sample(parts: list[Part], at: float, into: dict[str, list[tuple[float, str, int]]]) -> None:
    """Append (run seconds, "PID#generation", RSS bytes) for every part that is serving (a
    restart's start-up is not its steady state)."""
    children = _parents()
    for part in parts:
        pid = part.pid
        if pid is not None and part.serving:
            into[part.name].append((at, f"{pid}#{part.generation}", tree_rss(pid, children)))
