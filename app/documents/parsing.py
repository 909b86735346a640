"""One page through the layout pipeline: raster → layout → blocks → relay → markdown.

The image work (rendering, cropping, encoding) and the assembly run in the worker processes;
the event loop only waits on them, on the layout service and on the relay. Each block is one
chat request through the same relay as every page and chat request (admission by its work,
routing, failover, deadlines, cancellation when the client leaves), under the key of the
document; at most OCRVL_OCR_BLOCK_CONCURRENCY blocks of one document are in flight. The page
answers with its markdown and its blocks; a block that failed carries its error, and the page
fails only when every block sent failed.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Receive

from app.chat import ChatRequest
from app.context import RequestContext
from app.documents import crops, markdown, streams
from app.documents.crops import LayoutPage, PagePlan, PlannedBlock
from app.documents.errors import DocumentError
from app.documents.job import NO_BLOCKS, OcrJob, PageResult
from app.documents.layouts import LayoutService, Located
from app.documents.markdown import BlockAnswer
from app.documents.workers import Held, Preprocessor
from app.errors import ClientClosed, GatewayError
from app.proxy import Relay

log = logging.getLogger("ocrvl.documents")
BLOCK_MAX_TOKENS = 4096  # PaddleX's pipeline default (`max_new_tokens`) for a block
PIXELS = ("min_pixels", "max_pixels")
PROMPT_TOKENS = 64  # the chat template and the prompt around a block's image, at most


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What the pages of one document share."""

    preprocessor: Preprocessor
    relay: Relay
    layouts: LayoutService
    blocks: asyncio.Semaphore  # the document's blocks in flight (OCRVL_OCR_BLOCK_CONCURRENCY)
    gone: asyncio.Event | None = None  # set once the client has left: no block starts
    transient: tuple[type[GatewayError], ...] = ()  # raised, not kept (jobs retry the page)


async def parse_page(
    job: OcrJob,
    index: int,
    tools: Pipeline,
    parent: RequestContext,
    receive: Receive,
    *,
    held: Held | None = None,
) -> PageResult:
    """Page `index` of `job` read block by block; its error in the result when it failed.
    `held`: its pixels, when the results cache's hash has rendered it already."""
    number = index + 1
    try:
        assert job.layout is not None  # noqa: S101 (the caller's choice of pipeline)
        request_id = f"{parent.request_id}-p{number}"
        page, found, plan = await _planned(job, index, tools, held, request_id)
        boxes = found.boxes
        with tools.layouts.timed("blocks"):
            replies, first_error = await _read_blocks(job, number, plan, tools, (parent, receive))
        with tools.layouts.timed("assemble"):
            parsed: markdown.Parsed = await tools.preprocessor.run(
                markdown.assemble, plan, replies, job.layout
            )
    except DocumentError as exc:
        return PageResult(number, error=exc.as_gateway_error())
    except tools.transient:
        raise
    except GatewayError as exc:
        if not isinstance(exc, ClientClosed):
            log.warning(
                "page %d failed: %s", number, exc.message, extra={"request_id": parent.request_id}
            )
        return PageResult(number, error=exc)
    if first_error is not None and parsed.failed == parsed.sent:
        return PageResult(number, error=first_error)
    return PageResult(
        number, parsed.markdown, parsed.finish_reason, parsed.usage,
        image=(found.image or page.url) if job.page_images else None, markdown=parsed.markdown,
        blocks=parsed.blocks, images=parsed.images if job.layout.images else None, boxes=boxes,
        empty=None if parsed.blocks else NO_BLOCKS,
        angle=found.angle, corrected=found.image, size=found.size,
    )  # fmt: skip


async def _planned(
    job: OcrJob, index: int, tools: Pipeline, held: Held | None, request_id: str
) -> tuple[LayoutPage, Located, PagePlan]:
    """The page for the layout service, its layout and its blocks cut, the page rasterised
    once: its pixels are held (the cache's hash's, else the layout page's) until it is cut.
    Held none (past OCRVL_PREPROCESS_HELD_BYTES), `prepare` renders it again."""
    assert job.layout is not None  # noqa: S101 (the caller's choice of pipeline)
    run, lossless = tools.preprocessor.run, job.layout.preprocessing
    mine = held.take() if held is not None else Held()
    try:
        with tools.layouts.timed("render"):
            if mine.pixels is None:
                page, mine = await tools.preprocessor.keeping(
                    crops.layout_page, job.source, index, lossless
                )
            elif mine.url is not None and not lossless:  # the hash's JPEG is the layout page's
                page = LayoutPage(mine.url, mine.pixels.width, mine.pixels.height)
            else:
                page = await run(crops.layout_page_of, job.source, index, mine.pixels, lossless)
        with tools.layouts.timed("layout"):
            found = await tools.layouts.locate(
                page.url, (page.width, page.height), job.layout, request_id
            )
        with tools.layouts.timed("cut"):
            plan = await run(
                crops.prepare, job.source, index, found.boxes, job.layout,
                found.image or mine.pixels,  # a page the service corrected is cut from its own
            )  # fmt: skip
    finally:
        mine.close()
    return page, found, plan


async def _read_blocks(
    job: OcrJob,
    number: int,
    plan: PagePlan,
    tools: Pipeline,
    caller: tuple[RequestContext, Receive],
) -> tuple[list[BlockAnswer | None], GatewayError | None]:
    """Every block that is sent, read at once (bounded by the document's block slots)."""
    sent = [i for i, block in enumerate(plan.blocks) if block.url is not None]
    tasks = [
        asyncio.create_task(_read(job, (number, i), plan.blocks[i], tools, caller)) for i in sent
    ]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    replies: list[BlockAnswer | None] = [None] * len(plan.blocks)
    first: GatewayError | None = None
    for i, (reply, error) in zip(sent, results, strict=True):
        replies[i] = reply
        first = first or error
    return replies, first


async def _read(
    job: OcrJob,
    where: tuple[int, int],
    block: PlannedBlock,
    tools: Pipeline,
    caller: tuple[RequestContext, Receive],
) -> tuple[BlockAnswer, GatewayError | None]:
    """One block's answer (or its error) through the relay; `where`: (page number, block)."""
    parent, receive = caller
    context = parent.part(f"p{where[0]}-b{where[1]}", job.model)
    try:
        async with tools.blocks:
            if tools.gone is not None and tools.gone.is_set():
                raise ClientClosed("the client closed the connection")
            guard = (block.label, job.loops)
            reply = await streams.answer(
                tools.relay, block_request(job, block), context, receive, guard
            )
    except tools.transient:
        raise
    except GatewayError as exc:
        return BlockAnswer(error=exc.body()["error"]), exc
    finally:
        parent.stops += context.stops
    parent.truncated = parent.truncated or context.truncated
    return BlockAnswer(reply.text, reply.finish_reason, reply.usage, loop=reply.loop), None


def block_request(job: OcrJob, block: PlannedBlock) -> ChatRequest:
    """The chat request for one block, as PaddleX's client sends it (`DocVLMGenAIClient
    Predictor`: the crop, the label's prompt, temperature 0, special tokens skipped, the pixel
    bounds, `max_completion_tokens` 4096 unless the client set `max_tokens`)."""
    assert block.url is not None  # noqa: S101 (sent blocks only)
    assert block.prompt is not None  # noqa: S101
    payload: dict[str, Any] = {
        "model": job.model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": block.url}},
                    {"type": "text", "text": block.prompt},
                ],
            }
        ],
        "temperature": 0,
        **job.sampling,
        "skip_special_tokens": True,
        "mm_processor_kwargs": dict(zip(PIXELS, block.pixels or _pixels(job), strict=True)),
    }
    limit = max_tokens(job, block.tokens)
    if limit is not None:
        payload["max_completion_tokens"] = limit
    raw = orjson.dumps(payload)
    return ChatRequest(payload, raw, job.model, stream=False, units=max(block.tokens, 1))


def _pixels(job: OcrJob) -> tuple[int, int]:
    return job.source.min_pixels, job.source.max_pixels


def max_tokens(job: OcrJob, visual_tokens: int) -> int | None:
    """The client's `max_tokens`, else PaddleX's 4,096 where the model's context has room for
    it after the block's prompt (a short context: what is left, or the engine's default)."""
    if job.max_tokens is not None:
        return job.max_tokens
    if job.model_len is None:
        return BLOCK_MAX_TOKENS
    room = job.model_len - visual_tokens - PROMPT_TOKENS
    return min(BLOCK_MAX_TOKENS, room) if room > 0 else None
