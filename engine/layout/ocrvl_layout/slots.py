"""Pages at the model's input size in memory the service and its worker processes share: a worker
resizes a page straight into a free slot, and the forward pass reads it there, so the resized
pixels (2 MB a page at 800x800) never cross a pipe nor get pickled (docs/layout-speed.md).

The memory is an anonymous file (memfd_create): it needs no /dev/shm (64 MB in a Docker
container unless compose says otherwise), and it ends with the last process that maps it, so a
killed service leaves nothing behind. A worker maps it through the service's descriptor in
/proc (`/proc/PID/fd/FD`, Linux, the same user). Torch-free: the worker side is `write`.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Address:
    """Where a worker finds the slots: the service's PID and descriptor, and their shape."""

    pid: int
    fd: int
    count: int
    shape: tuple[int, int, int]  # (height, width, 3) uint8

    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


def slots_for(max_batch: int, processes: int) -> int:
    """How many slots keep the forward pass fed: the batch running, two more filling, and a page
    in hand for each worker process."""
    return 3 * max_batch + processes


def _mapped(fd: int, count: int, shape: tuple[int, int, int]) -> tuple[mmap.mmap, np.ndarray]:
    memory = mmap.mmap(fd, count * int(np.prod(shape)))
    return memory, np.ndarray((count, *shape), dtype=np.uint8, buffer=memory)


class PageSlots:
    """`count` slots of `shape` uint8 pixels; a slot is held from a page's resizing until its
    forward pass has read it."""

    def __init__(self, count: int, shape: tuple[int, int, int]) -> None:
        self.fd = os.memfd_create("ocrvl-layout-pages", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, count * int(np.prod(shape)))
        self.memory, self.pages = _mapped(self.fd, count, shape)
        self.address = Address(os.getpid(), self.fd, count, shape)
        self.free: asyncio.Queue[int] = asyncio.Queue()
        for index in range(count):
            self.free.put_nowait(index)
        self.taking = asyncio.Lock()  # one request takes its slots at a time, in arrival order

    async def acquire(self, wanted: int) -> list[int]:
        """`wanted` free slots (at most `count`), once they are free: a request takes them all
        before the next takes any, so none holds part of its pages' slots while it waits for
        the rest and another the other part (slots come back as passes end, not as requests
        take them)."""
        taken: list[int] = []
        async with self.taking:
            try:
                while len(taken) < wanted:
                    taken.append(await self.free.get())
            except BaseException:
                self.release(taken)
                raise
        return taken

    def release(self, indexes: list[int]) -> None:
        for index in indexes:
            self.free.put_nowait(index)

    def view(self, index: int) -> np.ndarray:
        """Slot `index`'s pixels (a view: no copy)."""
        page: np.ndarray = self.pages[index]
        return page

    def close(self) -> None:
        """Unmap the slots (left to the collector while a page still holds a view) and close
        the descriptor."""
        self.pages = np.empty((0,), dtype=np.uint8)
        with contextlib.suppress(BufferError):  # a page still held: unmapped when it lets go
            self.memory.close()
        os.close(self.fd)


_attached: dict[Address, np.ndarray] = {}  # in a worker: the slots it has mapped (its own state)


def write(address: Address, index: int) -> np.ndarray:
    """In a worker: slot `index` of the service's slots, to write a page into."""
    pages = _attached.get(address)
    if pages is None:
        fd = os.open(address.path(), os.O_RDWR)
        try:
            _, pages = _mapped(fd, address.count, address.shape)
        finally:
            os.close(fd)  # the mapping keeps the memory
        _attached.clear()  # a service has one set of slots: an older mapping is stale
        _attached[address] = pages
    view: np.ndarray = pages[index]
    return view


def probe(address: Address) -> int:
    """In a worker: map the slots (OSError where this system does not let it); their count."""
    write(address, 0)
    return address.count
