"""glibc's allocator under `ocrvl serve`: pages reused while busy, handed back once idle.

Each test runs in a fresh interpreter: allocator settings are per process and last for good.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")

PAGE_FAULTS = """
import resource
from app.allocator import reuse_freed_memory
reuse_freed_memory()
source = bytes(1024 * 1024)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):  # a page body arrives, is copied, and goes, 200 times
    copy = bytearray(source)
    del copy
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""

RSS = """
import pathlib
from app.allocator import reuse_freed_memory, trim_when_idle
reuse_freed_memory()

def rss_mb():
    status = pathlib.Path("/proc/self/status").read_text().split()
    return int(status[status.index("VmRSS:") + 1]) / 1024
"""

TRIM = (
    RSS
    + """
import asyncio

idle = rss_mb()
pages = [bytearray(1024 * 1024) for _ in range(100)]  # 100 pages in flight, in the heap
pin = bytearray(256 * 1024)  # a block above them: the heap's top cannot shrink past it
del pages
held = rss_mb()
looks = iter([True, False])  # one look busy (a request finished since), then idle

async def main():
    asked = 0
    looked = asyncio.Event()

    def busy(since):
        nonlocal asked
        asked += 1
        if asked == 6:  # five looks at least (two questions a look at most): long past the trim
            looked.set()
        return next(looks, False)

    trimmer = asyncio.create_task(trim_when_idle(busy, every=0.05))
    await asyncio.wait_for(looked.wait(), 30)  # the trimmer ran on to its next sleep since
    trimmer.cancel()

asyncio.run(main())
print(idle, held, rss_mb())
"""
)


def run(script: str, **env: str) -> str:
    """`script`'s output, run by a fresh interpreter in the repository with `env` added."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        check=True,
        env=clean | env,
        timeout=60,
    )
    return result.stdout


@pytest.mark.parametrize(
    ("env", "reused"),
    [
        ({}, True),
        ({"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}, False),  # the gateway's setting before
        ({"MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}, False),  # glibc's default
    ],
    ids=["ocrvl_serve", "operator_mmap_threshold", "operator_trim_threshold"],
)
def test_page_sized_blocks_are_reused_without_faulting_in(
    env: dict[str, str], reused: bool
) -> None:
    """After `reuse_freed_memory`, a freed 1 MB block is the next one's memory: copying a
    page 200 times costs a few hundred page faults, not the ~50,000 of mapping it afresh each
    time. An operator's MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ wins (and either,
    this low, brings the faults back)."""
    faults = int(run(PAGE_FAULTS, **env))
    assert faults < 2000 if reused else faults > 200 * 200


def test_an_idle_gateway_hands_freed_pages_back() -> None:
    """Pages freed below a live block stay in the heap (glibc cannot shrink it) until
    `trim_when_idle` sees the gateway idle after being busy: then the memory goes back."""
    idle, held, after = map(float, run(TRIM).split())
    assert held > idle + 80  # the 100 MB of freed pages still counted
    assert after < held - 80
