"""Dynamic batching across requests: pages queue, one worker forms batches and runs them.

The worker takes the first page waiting, then more until it has `max_batch` or `max_wait`
has passed since that first page arrived, and runs the batch as one forward pass in a thread
of its own (the event loop keeps accepting and decoding meanwhile). While a pass runs, the next
pages queue: under load, batches fill by themselves. Each page's candidates go back to the
request that sent it. The pages a service holds are bounded (--max-queue counts every page of
the requests admitted, from decoding to its answer): a request that does not fit is refused at
once (503 with Retry-After), before any decoding, never left to wait without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ocrvl_layout.detections import Candidates
from ocrvl_layout.errors import Overloaded
from ocrvl_layout.metrics import Metrics
from ocrvl_layout.model import BatchPage, LayoutModel

log = logging.getLogger("ocrvl_layout")
T = TypeVar("T")


@dataclass
class _Waiting:
    page: BatchPage
    future: asyncio.Future[Candidates]
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """The queue of pages and the worker that runs them through `model` in batches."""

    def __init__(
        self,
        model: LayoutModel,
        metrics: Metrics,
        *,
        max_batch: int,
        max_wait: float,
        max_queue: int,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.queue: asyncio.Queue[_Waiting] = asyncio.Queue()
        self.held = 0  # pages of the requests admitted (decoding, queued or in a pass)
        self.pass_seconds = 0.05  # a running mean of one pass's time, for Retry-After
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="layout-forward")
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the worker (on the running loop)."""
        self._worker = asyncio.create_task(self._run(), name="layout-batcher")

    async def stop(self) -> None:
        """Stop the worker; pages still queued are answered with 503."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        while not self.queue.empty():
            waiting = self.queue.get_nowait()
            if not waiting.future.done():
                waiting.future.set_exception(Overloaded("the service is stopping", retry_after=5))
        self._thread.shutdown(wait=True, cancel_futures=True)

    @contextlib.contextmanager
    def admitted(self, pages: int) -> Iterator[None]:
        """Hold `pages` of --max-queue while a request's pages are decoded, wait and run;
        Overloaded at once, before any decoding, if they would pass it."""
        held = self.held
        if held + pages > self.max_queue:
            passes = math.ceil((held + pages) / self.max_batch)
            raise Overloaded(
                f"the layout service holds {held} pages and {pages} more would pass its limit "
                f"of {self.max_queue} (--max-queue); retry later",
                retry_after=math.ceil(passes * self.pass_seconds),
            )
        self.held += pages
        self.metrics.held_pages.set(self.held)
        try:
            yield
        finally:
            self.held -= pages
            self.metrics.held_pages.set(self.held)

    async def exclusive(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` in the forward thread, between two batches: the preprocessing
        models run on the layout model's device, one pass at a time with its passes."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, function, *args)

    async def run(self, pages: list[BatchPage]) -> list[Candidates]:
        """Each page's candidates, once the batches holding them have run (within `admitted`)."""
        loop = asyncio.get_running_loop()
        waiting = [_Waiting(page, loop.create_future()) for page in pages]
        for item in waiting:
            self.queue.put_nowait(item)
        self.metrics.queue_depth.set(self.queue.qsize())
        try:
            return list(await asyncio.gather(*(item.future for item in waiting)))
        finally:
            for item in waiting:  # a client gone: its pages still queued are skipped
                item.future.cancel()

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            if batch:
                await self._forward(batch)

    async def _next_batch(self) -> list[_Waiting]:
        first = await self.queue.get()
        batch = [first]
        deadline = first.arrived + self.max_wait
        while len(batch) < self.max_batch:
            if not self.queue.empty():
                batch.append(self.queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), remaining))
            except TimeoutError:
                break
        self.metrics.queue_depth.set(self.queue.qsize())
        return [item for item in batch if not item.future.done()]

    async def _forward(self, batch: list[_Waiting]) -> None:
        started = time.monotonic()
        for item in batch:
            self.metrics.queue_wait.observe(started - item.arrived)
        loop = asyncio.get_running_loop()
        pages = [item.page for item in batch]
        try:
            found = await loop.run_in_executor(self._thread, self.model.detect, pages)
        except Exception as error:  # the model failed: every request of the batch learns it
            log.exception("layout forward pass of %d pages failed", len(batch))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            return
        seconds = time.monotonic() - started
        self.pass_seconds = 0.8 * self.pass_seconds + 0.2 * seconds
        self.metrics.forward_passes.inc()
        self.metrics.pages.inc(len(batch))
        self.metrics.batch_size.observe(len(batch))
        self.metrics.forward_seconds.observe(seconds)
        self.metrics.page_seconds.observe(seconds / len(batch))
        for item, candidates in zip(batch, found, strict=True):
            if not item.future.done():
                item.future.set_result(candidates)
