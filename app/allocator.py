"""glibc's allocator: page-sized blocks reused while busy, handed back to the OS once idle.

Pages are 0.2-1.5 MB each and each passes through a few big buffers (socket reads, the body,
the upstream write). Where such a block comes from decides both the gateway's CPU and its
memory:

- glibc's default puts blocks over its mmap threshold in mmap and raises that threshold each
  time one is freed (up to 32 MB), after which they come from the heap and stay there when
  freed: a burst of 256 pages left ~700 MB held for good.
- A low fixed threshold (128 KiB) returns every freed page at once, but then every big block
  is a fresh mapping the kernel must fault in page by page and unmap again: on this project's
  VM that was half of the gateway's CPU per page (bench.overhead: 1.1 ms of which 0.55 ms in
  the kernel, 0.64 ms in all once blocks were reused).

So `ocrvl serve` fixes the mmap threshold at glibc's maximum (blocks up to 32 MiB, i.e. any
page, come from the heap and the next page reuses them without faulting) and the heap's trim
threshold at 64 MiB (glibc's 128 KiB would shrink the heap's top after each page, for the next
to fault it in again), and `trim_when_idle` hands what the heap holds free back to the OS with
`malloc_trim` once the gateway is idle. Targets met either way (bench.memory, 256 pages of
1.33 MB in flight): peak <= idle + 1.3 x the bytes in flight, <= idle + 50 MB a few seconds
after. An operator's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ wins.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("ocrvl.allocator")

# <malloc.h>'s mallopt parameters, the values `ocrvl serve` fixes and the variables that win
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit systems
TRIM_THRESHOLD = 64 * 1024 * 1024
PARAMETERS = (
    (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
    (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
)


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # musl and others have no mallopt/malloc_trim: nothing to tune there
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def reuse_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (each one the environment does
    not already set); False where that is not glibc or a mallopt call failed."""
    libc = _glibc()
    if libc is None:
        return False
    done = True
    for parameter, value, variable in PARAMETERS:
        if variable not in os.environ and libc.mallopt(parameter, value) != 1:
            log.warning("mallopt(%s) failed: pages may cost more CPU or memory", variable)
            done = False
    return done


async def trim_when_idle(busy: Callable[[float], bool], every: float = 2.0) -> None:
    """Each `every` seconds: when the gateway was busy since the last look (`busy(since)`,
    `since` a `time.monotonic()` reading) and is idle now, hand the heap's free pages back to
    the OS (the lifespan runs this as a task; a trim takes about a millisecond)."""
    libc = _glibc()
    if libc is None:
        return
    was_busy = False
    since = time.monotonic()
    while True:
        await asyncio.sleep(every)
        now = time.monotonic()
        was_busy = busy(since) or was_busy
        since = now
        if was_busy and not busy(now):
            libc.malloc_trim(0)
            was_busy = False
