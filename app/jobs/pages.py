"""One job's pages through the relay, in the background lane, each answer kept once.

At most OCRVL_JOB_PAGE_CONCURRENCY pages are in flight: a page's task is made only when a slot
is free, so a 1,000-page job holds that many rendered pages in memory, not 1,000. Pages kept
before (by a gateway that died) are not read again. A page the backends cannot take now
(every backend full for longer than the queue allows, or none healthy) waits and is tried
again; any other failure is kept as that page's error, as /v1/ocr reports it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message

from app.context import RequestContext
from app.documents import streams
from app.documents.cache import PageCache
from app.documents.errors import DocumentError
from app.documents.fanout import page_request, page_result
from app.documents.job import OcrJob, PageResult
from app.documents.layout_options import LayoutOptions
from app.documents.layouts import LayoutService
from app.documents.parsing import Pipeline, parse_page
from app.documents.raster import RenderedPage, Source
from app.documents.workers import Held, Preprocessor
from app.errors import BackendUnavailable, GatewayError, Overloaded
from app.jobs.events import JobEvents
from app.proxy import Relay
from app.scheduling.queue import BACKGROUND
from app.store import Job, Store
from app.store.base import PageRecord, StoreUnavailable
from app.usage.meter import Meter

TRANSIENT = (Overloaded, BackendUnavailable)
RETRY_DELAYS = (1, 2, 4, 8, 15, 30, 30, 30, 30, 30)  # ~3 min for a backend to come back


@dataclass(frozen=True, slots=True)
class PageWork:
    """What every page of one job shares."""

    job: Job
    ocr: OcrJob
    store: Store
    relay: Relay
    preprocessor: Preprocessor
    events: JobEvents
    meter: Meter | None = None  # usage per key (None: OCRVL_USAGE=off)
    layouts: LayoutService | None = None  # the layout service (None: OCRVL_LAYOUT_URL unset)
    blocks: asyncio.Semaphore | None = None  # the job's blocks in flight (with a layout)
    cache: PageCache | None = None  # the results cache (None: off, or bypassed by the job)


async def run_pages(work: PageWork, concurrency: int) -> None:
    """Read and keep every page of the job not kept yet; returns once all are kept."""
    BACKGROUND.set(True)  # this task's (and its page tasks') requests take the background lane
    kept = await work.store.page_numbers(work.job.id)
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        try:
            await _page(work, index)
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as group:  # one failure (the store gone) stops them all
            for index in work.ocr.pages:
                if index + 1 in kept:
                    continue
                await slots.acquire()
                group.create_task(one(index))
    except* StoreUnavailable as outage:  # unwrapped: the runner pauses the job, never fails it
        raise _first(outage) from None


def _first(group: BaseExceptionGroup[StoreUnavailable]) -> StoreUnavailable:
    """The first StoreUnavailable of a (nested) exception group."""
    inner = group.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner


async def _never() -> Message:
    """A job has no client to leave: its pages end when their task is cancelled."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}  # pragma: no cover (never reached)


async def _page(work: PageWork, index: int) -> None:
    number = index + 1
    job = work.job
    started = time.perf_counter()
    for delay in (*RETRY_DELAYS, None):
        context = RequestContext(
            request_id=f"{job.id}-p{number}",
            key_name=job.owner,
            model=job.spec.get("model"),
            served_model=work.ocr.model,
        )
        try:
            result = await _read(work, index, context)
        except TRANSIENT:
            if delay is None:
                raise
            await asyncio.sleep(delay)
            continue
        break
    failed = result.error is not None
    work.events.metrics.count_stops("jobs", context.stops)
    work.events.pages.labels("failed" if failed else "done").inc()
    work.events.page_seconds.observe(time.perf_counter() - started)
    usage = result.usage or {}
    record = PageRecord(
        number,
        orjson.dumps(result.as_dict()),
        failed,
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )
    kept = await work.store.add_page(job.id, record)
    if kept and not failed and work.meter is not None:  # once, even for a page read twice
        reserved = job.spec.get("reserved")  # in the store since its submission
        if result.cached:
            work.meter.cached_page(job.owner, work.ocr.model, reserved)
        else:
            work.meter.job_page(job.owner, work.ocr.model, usage, reserved=bool(reserved))


async def _read(work: PageWork, index: int, context: RequestContext) -> PageResult:
    """The page from the cache, else read."""
    if work.cache is None:
        return await _read_now(work, index, context, None, None)
    return await work.cache.page(
        work.ocr, index, work.preprocessor,
        lambda seen, held: _read_now(work, index, context, seen, held),
    )  # fmt: skip


async def _read_now(
    work: PageWork,
    index: int,
    context: RequestContext,
    rendered: RenderedPage | None,
    held: Held | None,
) -> PageResult:
    """The page's answer, or its error (transient ones raised, to be tried again: with a
    layout, the whole page again, its layout service's 503 included); `rendered` (read whole)
    or `held` (laid out): the page, when the cache has rendered it."""
    number = index + 1
    if work.ocr.layout is not None and work.layouts is not None:
        blocks = work.blocks or asyncio.Semaphore(1)
        pipeline = Pipeline(
            work.preprocessor, work.relay, work.layouts, blocks, transient=TRANSIENT
        )
        return await parse_page(work.ocr, index, pipeline, context, _never, held=held)
    try:
        rendered = rendered or await work.preprocessor.render(work.ocr.source, index)
        guard = (work.ocr.task, work.ocr.loops)
        reply = await streams.answer(
            work.relay, page_request(work.ocr, rendered), context, _never, guard
        )
        return page_result(number, reply, work.ocr.task, rendered.page_size)
    except DocumentError as exc:
        return PageResult(number, error=exc.as_gateway_error())
    except TRANSIENT:
        raise
    except GatewayError as exc:
        return PageResult(number, error=exc)


def ocr_job(job: Job, path: str) -> OcrJob:
    """The job's stored spec as the page requests' OcrJob, reading the file at `path`."""
    from app.documents.sniff import FileKind  # noqa: PLC0415

    spec: dict[str, Any] = job.spec
    source = Source(
        path, FileKind(spec["kind"], spec["mime"]), spec["dpi"], spec["min_pixels"],
        spec["max_pixels"], spec["max_page_pixels"],
    )  # fmt: skip
    layout = spec.get("layout")
    if spec["task"] == "spotting" and not layout:
        source = source.for_spotting(spec["max_pixels"])
    return OcrJob(
        source, list(spec["pages"]), spec["task"], spec["served_model"], spec["max_tokens"],
        layout=LayoutOptions.from_dict(layout) if layout else None,
        model_len=spec.get("model_len"), loops=spec.get("loops", "cut"),
    )  # fmt: skip
