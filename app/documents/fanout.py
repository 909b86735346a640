"""A document's pages to the backends: each page through the same relay as a chat request.

Pages share the request's API key name (fairness by key), run at most
OCRVL_OCR_PAGE_CONCURRENCY at a time, and come back as they finish. A page is read whole
(one request) or, with a layout, block by block (app/documents/parsing.py). A page that fails
carries its error; the others still come back. One task watches the client: once it has gone,
every page and block still running is closed upstream and none is started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from starlette.types import Message, Receive

from app.chat import ChatRequest
from app.context import RequestContext
from app.documents import answers, otsl, spotting, streams
from app.documents.cache import PageCache
from app.documents.errors import DocumentError
from app.documents.job import PROMPTS, OcrJob, PageResult
from app.documents.layouts import LayoutService
from app.documents.parsing import BLOCK_MAX_TOKENS, Pipeline, parse_page
from app.documents.raster import RenderedPage
from app.documents.workers import Held, Preprocessor
from app.errors import ClientClosed, GatewayError
from app.guard import until_disconnected
from app.proxy import Relay

log = logging.getLogger("ocrvl.documents")


class Disconnect:
    """The one reader of the client's `receive`; pages get `receive`, which only ever says that
    the client has gone (concurrent pages must not read the real one)."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        await until_disconnected(receive)
        self.gone.set()

    async def receive(self) -> Message:
        """Returns once the client has disconnected."""
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def close(self) -> None:
        """Stop watching."""
        self._watcher.cancel()


async def run_pages(
    job: OcrJob,
    *,
    preprocessor: Preprocessor,
    relay: Relay,
    parent: RequestContext,
    disconnect: Disconnect,
    concurrency: int,
    layouts: LayoutService | None = None,
    block_concurrency: int = 32,
    cache: PageCache | None = None,
) -> AsyncGenerator[PageResult]:
    """Every page of `job`, as each finishes (block by block when `job.layout` is set); with
    `cache`, a page answered before is taken from it and one read now is kept in it."""
    slots = asyncio.Semaphore(concurrency)
    pipeline = None
    if job.layout is not None and layouts is not None:
        pipeline = Pipeline(
            preprocessor, relay, layouts, asyncio.Semaphore(block_concurrency), disconnect.gone
        )

    async def one(index: int) -> PageResult:
        async with slots:
            if disconnect.gone.is_set():
                return PageResult(index + 1, error=ClientClosed("the client closed the connection"))
            if cache is not None:
                return await cache.page(
                    job, index, preprocessor, lambda seen, held: read(index, seen, held)
                )
            return await read(index, None, None)

    async def read(index: int, rendered: RenderedPage | None, held: Held | None) -> PageResult:
        if pipeline is not None:
            return await parse_page(job, index, pipeline, parent, disconnect.receive, held=held)
        return await _page(
            job,
            index,
            preprocessor=preprocessor,
            relay=relay,
            parent=parent,
            disconnect=disconnect,
            rendered=rendered,
        )

    tasks = [asyncio.create_task(one(index)) for index in job.pages]
    try:
        for finished in asyncio.as_completed(tasks):
            yield await finished
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _page(
    job: OcrJob,
    index: int,
    *,
    preprocessor: Preprocessor,
    relay: Relay,
    parent: RequestContext,
    disconnect: Disconnect,
    rendered: RenderedPage | None = None,
) -> PageResult:
    """Page `index` read whole (`rendered`: the page, when the cache has rendered it)."""
    number = index + 1
    context = parent.part(f"p{number}", job.model)
    try:
        rendered = rendered or await preprocessor.render(job.source, index)
        reply = await streams.answer(
            relay, page_request(job, rendered), context, disconnect.receive, (job.task, job.loops)
        )
        result = page_result(number, reply, job.task, rendered.page_size)
        if job.page_images:
            result.image = rendered.url
    except DocumentError as exc:
        return PageResult(number, error=exc.as_gateway_error())
    except GatewayError as exc:
        if not isinstance(exc, ClientClosed):
            log.warning(
                "page %d failed: %s", number, exc.message, extra={"request_id": parent.request_id}
            )
        return PageResult(number, error=exc)
    finally:
        parent.stops += context.stops
    parent.truncated = parent.truncated or context.truncated
    return result


def page_request(job: OcrJob, page: RenderedPage) -> ChatRequest:
    """The chat request for one page, shaped like PaddleOCR's own client's (shared/CLIENTS.md)."""
    payload: dict[str, Any] = {
        "model": job.model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": page.url}},
                    {"type": "text", "text": PROMPTS[job.task]},
                ],
            }
        ],
        "temperature": 0,
        **job.sampling,
        # the bounds the page was resized to: the engine's own resize then changes nothing
        "mm_processor_kwargs": {
            "min_pixels": job.source.min_pixels,
            "max_pixels": job.source.max_pixels,
        },
    }
    if job.task == "spotting":  # its locations are special tokens (app/documents/spotting.py)
        payload["skip_special_tokens"] = False
    payload["max_tokens"] = page_max_tokens(job)
    return ChatRequest(payload=payload, raw=orjson.dumps(payload), model=job.model, stream=False)


def page_max_tokens(job: OcrJob) -> int:
    """The client's `max_tokens`, else a block's (PaddleOCR's own 4,096, its pipeline's most),
    held to the engine's context length when known (vLLM also holds it to what the prompt
    leaves). Without one, vLLM decodes to the context's end (37 s and 3,389 tokens a page on the
    tiny model)."""
    if job.max_tokens is not None:
        return job.max_tokens
    return min(BLOCK_MAX_TOKENS, job.model_len) if job.model_len else BLOCK_MAX_TOKENS


def page_result(
    number: int, reply: streams.Reply, task: str, size: tuple[int, int] | None = None
) -> PageResult:
    """The page's text (a table also as HTML; spotted regions with their polygons in the
    pixels of the page, `size`, the answer first cut of loops as PaddleX cuts a block's) from
    the model's answer; a stopped loop's `stopped` and `loop` with it (app/documents/streams.py)."""
    text = reply.text
    html = otsl.to_html(text) if task == "table" and otsl.is_otsl(text) else None
    spotted = None
    if task == "spotting" and size is not None:
        text, regions = spotting.read(answers.content(task, text), *size)
        spotted = [{"text": r.text, "polygon": [list(p) for p in r.polygon]} for r in regions]
    result = PageResult(number, text, reply.finish_reason, reply.usage, html, spotting=spotted)
    if reply.loop is not None:
        result.stopped, result.loop = streams.STOPPED, reply.loop
    return result
