"""glibc's allocator, told to give big freed blocks back to the OS at once.

Pages are 0.2-1.5 MB each and hundreds may be in flight. By default glibc raises its mmap
threshold each time a large mmapped block is freed (up to 32 MB), after which such blocks come
from the heap and stay there when freed: a burst of 256 pages left ~700 MB held for good. A
fixed threshold (setting it turns the dynamic one off) keeps every block of 128 KiB or more in
mmap, so freeing a page returns its memory; smaller objects stay on the heap as before. What
the heap still holds after a burst (parsed JSON, connection buffers: ~180 MB after 512 pages)
goes back with `malloc_trim` once the gateway is idle again.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger("ocrvl.allocator")

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, now fixed
ENVIRONMENT = "MALLOC_MMAP_THRESHOLD_"  # the operator's own choice wins


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


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold for this process; False where that is not glibc or the
    environment already sets it."""
    libc = _glibc()
    if libc is None or ENVIRONMENT in os.environ:
        return False
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD) failed: freed pages may stay in the heap")
        return False
    return True


async def trim_when_idle(busy: Callable[[], bool], every: float = 2.0) -> None:
    """Each `every` seconds: once the gateway went from busy to idle, hand the heap's free
    pages back to the OS (the lifespan runs this as a task; a trim takes about a millisecond)."""
    libc = _glibc()
    if libc is None:
        return
    was_busy = False
    while True:
        await asyncio.sleep(every)
        if busy():
            was_busy = True
        elif was_busy:
            libc.malloc_trim(0)
            was_busy = False
