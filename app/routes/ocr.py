"""`POST /v1/ocr`: an image or a PDF in, every page's text out (JSON, NDJSON stream, markdown)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncGenerator

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app import catalog, policy
from app.context import RequestContext
from app.documents import cache, layouts, output, upload
from app.documents.errors import DocumentError
from app.documents.fanout import Disconnect, run_pages
from app.documents.job import OcrJob, PageResult
from app.documents.layout_options import LayoutOptions
from app.documents.raster import Source
from app.errors import PayloadTooLarge
from app.quotas import Admitted
from app.state import Context, Gateway, GatewayDep

router = APIRouter()


@router.post("/v1/ocr")
async def ocr(request: Request, _: Admitted, gateway: GatewayDep, context: Context) -> Response:
    """Read every (chosen) page of the file with the model; see docs/ocr.md."""
    settings = gateway.settings
    received = await upload.read_upload(request, settings.max_file_bytes)
    cleanup = contextlib.AsyncExitStack()  # the spooled file, the watcher, the page tasks
    if received.upload is not None:
        cleanup.push_async_callback(received.upload.close)
    try:
        data = await _file_bytes(gateway, received)
        context.model = received.options.model
        context.served_model = _served_model(gateway, received.options.model)
        _check_policy(gateway, received.options.max_tokens, context.served_model)
        options = received.options
        layout, fallback = layouts.choose(
            gateway.layouts, options.layout, options.layout_options, task=options.task
        )
        mode = output.layout_fields(layout is not None, fallback)
        job = await _prepare(gateway, cleanup, received, data, context.served_model, layout=layout)
        if gateway.usage is not None:  # the whole document under the key's page budget, first
            await gateway.usage.admit(context, len(job.pages))
        cached = _cache(gateway, request, options, job, context)
        disconnect = Disconnect(request.receive)
        cleanup.callback(disconnect.close)
        pages = run_pages(
            job,
            preprocessor=gateway.documents,
            relay=gateway.relay,
            parent=context,
            disconnect=disconnect,
            concurrency=settings.ocr_page_concurrency,
            layouts=gateway.layouts,
            block_concurrency=settings.ocr_block_concurrency,
            cache=cached,
        )
        cleanup.push_async_callback(pages.aclose)
        pages = _counted(pages, context)
        cleanup.push_async_callback(pages.aclose)
        media_type = output.negotiate(request.headers.get("accept", ""), received.options.stream)
        context.stream = media_type == output.NDJSON
        if context.stream:  # from here the response owns the cleanup
            numbers = [index + 1 for index in job.pages]
            return output.PageStream(job.model, numbers, pages, cleanup, mode)
        async with cleanup:
            done = [page async for page in pages]
    except BaseException:
        await cleanup.aclose()
        raise
    response = _whole(job.model, done, media_type, mode)
    if gateway.results is not None:
        response.headers["x-ocrvl-cache"] = cache.state(done, cached is not None)
    return response


def _cache(
    gateway: Gateway,
    request: Request,
    options: upload.OcrOptions,
    job: OcrJob,
    context: RequestContext,
) -> cache.PageCache | None:
    """The results cache for this document's pages, unless it is off or the request
    bypasses it (`Cache-Control: no-cache`, `cache=false`)."""
    if gateway.results is None:
        return None
    if not cache.wanted(request.headers.get("cache-control"), options.cache):
        return None
    entry = gateway.pool.served_models().get(job.model)
    wanted = cache.options_of(job, entry)
    return cache.PageCache.scoped(gateway.results, context.key_name, wanted, gateway.metrics)


async def _counted(
    pages: AsyncGenerator[PageResult], context: RequestContext
) -> AsyncGenerator[PageResult]:
    """`pages`, each answered one counted on the request's context (app/usage meters it)."""
    async for page in pages:
        if page.cached:  # no engine work: counted apart, its budget page given back
            context.cached += 1
        elif page.error is None:
            usage = page.usage or {}
            context.answered += 1
            context.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            context.completion_tokens += int(usage.get("completion_tokens") or 0)
        yield page


async def _file_bytes(gateway: Gateway, received: upload.Upload) -> bytes | None:
    """The decoded or fetched file (None for a multipart upload, which stays spooled)."""
    data = received.data
    if received.url is not None:
        data = await gateway.media.fetch(received.url, "file")
    limit = gateway.settings.max_file_bytes
    if data is not None and len(data) > limit:
        raise PayloadTooLarge(
            f"`file` is {len(data)} bytes, over OCRVL_MAX_FILE_BYTES ({limit})", param="file"
        )
    return data


def _served_model(gateway: Gateway, requested: str | None) -> str:
    """The served name for the `model` option; the first served model when none is given."""
    served_models = gateway.pool.require_models("to read the document")
    return catalog.resolve(requested, served_models) if requested else next(iter(served_models))


def _check_policy(gateway: Gateway, max_tokens: int | None, model: str) -> None:
    """The request policy on what a client sets in the pages' requests (its `max_tokens`)."""
    entry = gateway.pool.served_models().get(model)
    policy.check({"max_tokens": max_tokens}, gateway.settings, policy.model_length(entry))


async def _prepare(
    gateway: Gateway,
    cleanup: contextlib.AsyncExitStack,
    received: upload.Upload,
    data: bytes | None,
    model: str,
    *,
    layout: LayoutOptions | None,
) -> OcrJob:
    """The file spooled to disk for the workers, sniffed, and its pages checked (no decoding)."""
    settings = gateway.settings
    options = received.options
    folder = tempfile.gettempdir()
    path, head = await asyncio.to_thread(upload.spool, received, data, folder)
    cleanup.push_async_callback(asyncio.to_thread, upload.remove, path)
    try:
        source = Source.sniffed(path, head, options.dpi, settings)
        if options.task == "spotting" and layout is None:
            source = source.for_spotting(settings.max_pixels)
        pages = await gateway.documents.inspect(source, options.pages, settings.max_pages)
    except DocumentError as exc:
        raise exc.as_gateway_error() from None
    model_len = policy.model_length(gateway.pool.served_models().get(model))
    return OcrJob(
        source, pages, options.task, model, options.max_tokens, options.page_images, layout,
        model_len, loops=options.loops or settings.loops,
    )  # fmt: skip


def _whole(model: str, pages: list[PageResult], media_type: str, mode: dict[str, str]) -> Response:
    """JSON or markdown once every page is in; when every page failed, the first error."""
    failures = sorted((p for p in pages if p.error is not None), key=lambda p: p.index)
    if failures and len(failures) == len(pages) and failures[0].error is not None:
        raise failures[0].error
    headers = {**output.summary_headers(pages), **output.layout_headers(mode)}
    if media_type == output.MARKDOWN:
        return Response(
            output.markdown(pages), media_type="text/markdown; charset=utf-8", headers=headers
        )
    body = orjson.dumps(output.document(model, pages, mode))
    return Response(body, media_type="application/json", headers=headers)
