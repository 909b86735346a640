"""`POST /layout-parsing`, `POST /restructure-pages`: PaddleX's serving API for PaddleOCR-VL.

A drop-in for `paddlex --serve --pipeline PaddleOCR-VL-1.5` (docs/clients.md): PaddleX's body
in (app/paddlex/schema.py), the gateway's own document pipeline in the middle (the layout
service, each block through the relay, as `/v1/ocr` with `layout=on`), PaddleX's answer out
(app/paddlex/results.py), every error in its envelope (app/paddlex/envelope.py). The request
passes the same API keys, per-key limits, page budgets, admission, request policy, remote-file
policy and file limits as `/v1/ocr`; a document is answered whole, as PaddleX answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app import policy
from app.bodies import capped
from app.context import RequestContext
from app.documents import cache, layouts, upload
from app.documents.errors import DocumentError
from app.documents.fanout import Disconnect, run_pages
from app.documents.job import OcrJob, PageResult
from app.documents.raster import Source
from app.errors import InvalidRequest, PayloadTooLarge
from app.paddlex import options, pages, results, returned, schema
from app.paddlex.envelope import LOG_ID, PaddleXRoute, success
from app.paddlex.restructure import Page
from app.paddlex.schema import InferRequest, RestructurePagesRequest
from app.quotas import Admitted
from app.state import Context, Gateway, GatewayDep

router = APIRouter(route_class=PaddleXRoute)
Body = TypeVar("Body", InferRequest, RestructurePagesRequest)
Visuals = tuple[str, dict[str, str]]
STEPS = ("use_doc_orientation_classify", "use_doc_unwarping")


@router.post("/layout-parsing")
async def layout_parsing(
    request: Request, _: Admitted, gateway: GatewayDep, context: Context
) -> Response:
    """Every page of the file through the layout pipeline; PaddleX's `InferResult`."""
    infer = await _body(request, gateway, InferRequest)
    if (refusal := schema.refused(infer)) is not None:
        raise refusal
    extra = options.extras(infer)
    infer = extra.request  # vlmExtraArgs' sampling fields and pixels over the request's
    data = await _file(gateway, infer.file)
    served = gateway.pool.require_models("to read the document")
    context.served_model = next(iter(served))
    layout = options.layout_options(infer, options.kind_pixels(extra, gateway.settings))
    if layout is not None:
        layout = layouts.choose(gateway.layouts, "on", layout)[0]
    model_len = policy.model_length(served[context.served_model])
    _check_policy(gateway, infer, model_len)
    async with contextlib.AsyncExitStack() as cleanup:
        source, found = await _prepare(gateway, cleanup, extra, data, layout is None)
        if gateway.usage is not None:  # the whole document under the key's page budget, first
            await gateway.usage.admit(context, len(found.indexes))
        job = OcrJob(
            source, found.indexes, infer.promptLabel or "ocr", context.served_model,
            infer.maxNewTokens, layout=layout, model_len=model_len,
            sampling=options.sampling(infer), loops=infer.loops or gateway.settings.loops,
        )  # fmt: skip
        read = await _read(job, request, gateway, context, cleanup)
        settings = results.settings_of(infer, layout)
        label, sizes = infer.promptLabel or "ocr", found.sizes
        steps = dict(zip(STEPS, options.preprocessing(infer), strict=True))
        made = [
            results.page_of(p, n, settings, label, steps) for p, n in zip(read, sizes, strict=True)
        ]
        writing = results.Writing(
            infer.prettifyMarkdown, infer.showFormulaNumber, infer.restructurePages,
            infer.mergeTables, infer.relevelTitles,
        )  # fmt: skip
        entries: list[dict[str, Any]] = await gateway.documents.run(results.written, made, writing)
        visualize = infer.visualize is not False  # PaddleX's server default: on
        shown = await _visuals(gateway, source, made, read) if visualize else None
    _with_images(entries, read if infer.returnMarkdownImages else None, shown)
    answer = await success(
        request, {"layoutParsingResults": entries, "dataInfo": found.data_info()}
    )
    if gateway.results is not None:  # PaddleX's body has no field for it: a header only
        consulted = cache.wanted(request.headers.get("cache-control"), True)
        answer.headers["x-ocrvl-cache"] = cache.state(read, consulted)
    return answer


@router.post("/restructure-pages")
async def restructure_pages(request: Request, _: Admitted, gateway: GatewayDep) -> Response:
    """Pages sent back, restructured; PaddleX's `RestructurePagesResult`."""
    body = await _body(request, gateway, RestructurePagesRequest)
    if (refusal := schema.refused_export(body)) is not None:
        raise refusal
    limit = gateway.settings.max_pages
    if len(body.pages) > limit:
        raise InvalidRequest(
            f"`pages` holds {len(body.pages)} pages, over OCRVL_MAX_PAGES ({limit})",
            param="pages",
            code="too_many_pages",
        )
    made = [returned.from_pruned(page.prunedResult, i) for i, page in enumerate(body.pages)]
    writing = results.Writing(
        body.prettifyMarkdown, body.showFormulaNumber, True, body.mergeTables,
        body.relevelTitles, body.concatenatePages,
    )  # fmt: skip
    entries: list[dict[str, Any]] = await gateway.documents.run(results.written, made, writing)
    sent = [page.markdownImages for page in body.pages]
    if body.returnMarkdownImages and body.concatenatePages and entries:
        joined: dict[str, str] = {}  # one page: every page's images
        for images in sent:
            joined.update(images or {})
        entries[0]["markdown"]["images"] = joined
    elif body.returnMarkdownImages:
        for entry, images in zip(entries, sent, strict=True):
            if images is not None:
                entry["markdown"]["images"] = images
    return await success(request, {"layoutParsingResults": entries})


def _with_images(
    entries: list[dict[str, Any]], read: list[PageResult] | None, shown: list[Visuals] | None
) -> None:
    """Each result's markdown images (`read`: the pages, when asked for), base64 as PaddleX
    sends them, and its `inputImage` and `outputImages` (`shown`, when drawn)."""
    for n, entry in enumerate(entries):
        if read is not None:
            images = read[n].images or {}
            entry["markdown"]["images"] = {k: v.partition(",")[2] for k, v in images.items()}
        if shown is not None:
            entry["inputImage"], entry["outputImages"] = shown[n]


async def _body(request: Request, gateway: Gateway, model: type[Body]) -> Body:
    """The JSON body (under /v1/ocr's cap for a file as base64) as PaddleX's `model`."""
    if request.headers.get("content-type", "").lower().startswith("multipart/"):
        raise InvalidRequest(
            'send a JSON body, {"file": "<base64 or URL>", "fileType": 0 or 1}, as PaddleX takes'
        )
    limit = gateway.settings.max_file_bytes * 4 // 3 + upload.JSON_OVERHEAD
    too_large = PayloadTooLarge(
        f"the request body is over {limit} bytes: a file may have at most OCRVL_MAX_FILE_BYTES "
        f"({gateway.settings.max_file_bytes}) before base64",
        param="file",
    )
    raw = b"".join([chunk async for chunk in capped(request, limit, too_large)])
    body = await asyncio.to_thread(_json, raw)  # 60 MB of JSON: not on the event loop
    if isinstance(body, dict) and isinstance(body.get("logId"), str):
        setattr(request.state, LOG_ID, body["logId"])  # errors carry it too, as PaddleX's do
    return await asyncio.to_thread(schema.parse, model, body)


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None


async def _file(gateway: Gateway, file: str) -> bytes:
    """The file: fetched under the remote-file policy (an http(s) URL), else base64."""
    if file.startswith(("http://", "https://")):
        data = await gateway.media.fetch(file, "file")
    else:
        data = await asyncio.to_thread(options.file_bytes, file)
    limit = gateway.settings.max_file_bytes
    if len(data) > limit:
        raise PayloadTooLarge(
            f"`file` is {len(data)} bytes, over OCRVL_MAX_FILE_BYTES ({limit})", param="file"
        )
    return data


def _check_policy(gateway: Gateway, infer: InferRequest, model_len: int | None) -> None:
    """The request policy on what the blocks' requests carry (`maxNewTokens`, or PaddleX's
    `vlmExtraArgs.max_new_tokens` over it), judged as chat's `max_tokens` is, in its own name."""
    extra = "max_new_tokens" in (infer.vlmExtraArgs or {})
    name = "vlmExtraArgs.max_new_tokens" if extra else "maxNewTokens"
    if infer.maxNewTokens is not None:
        policy.bounded_integer(
            name, infer.maxNewTokens, 1, model_len, "the served model's max_model_len"
        )


async def _prepare(
    gateway: Gateway,
    cleanup: contextlib.AsyncExitStack,
    extra: options.Extras,
    data: bytes,
    whole: bool,
) -> tuple[Source, pages.Pages]:
    """The file spooled for the workers, sniffed, its type checked against `fileType`, and
    every page checked (OCRVL_MAX_PAGES, pixels, encryption) and measured; `whole`: each page
    is read whole, with its prompt's pixel bounds (a spotted page enlarged first)."""
    infer, label = extra.request, extra.request.promptLabel or "ocr"
    received = upload.Upload(upload.OcrOptions(), data=data)
    path, head = await asyncio.to_thread(upload.spool, received, data, tempfile.gettempdir())
    cleanup.push_async_callback(asyncio.to_thread, upload.remove, path)
    settings = gateway.settings
    try:
        source = Source.sniffed(path, head, upload.DEFAULT_DPI, settings)
        options.check_type(infer.fileType, source.kind)
        if whole and label == "spotting":
            source = source.for_spotting(settings.max_pixels)
        else:
            low, high = (
                options.page_pixels(extra, settings, label)
                if whole
                else options.pixels(infer, settings)
            )
            source = replace(source, min_pixels=low, max_pixels=high)
        found: pages.Pages = await gateway.documents.run(pages.inspect, source, settings.max_pages)
    except DocumentError as exc:
        raise exc.as_gateway_error() from None
    return source, found


async def _read(
    job: OcrJob,
    request: Request,
    gateway: Gateway,
    context: RequestContext,
    cleanup: contextlib.AsyncExitStack,
) -> list[PageResult]:
    """Every page read (the relay, admission, cancellation when the client leaves), counted
    on the request's context for usage; the first failure fails the request."""
    disconnect = Disconnect(request.receive)
    cleanup.callback(disconnect.close)
    read = run_pages(
        job, preprocessor=gateway.documents, relay=gateway.relay, parent=context,
        disconnect=disconnect, concurrency=gateway.settings.ocr_page_concurrency,
        layouts=gateway.layouts, block_concurrency=gateway.settings.ocr_block_concurrency,
        cache=_cache(gateway, request, job, context.key_name),
    )  # fmt: skip
    done: list[PageResult] = []
    try:
        async for page in read:
            done.append(page)
            if page.cached:  # no engine work: counted apart, its budget page given back
                context.cached += 1
            elif page.error is None:
                usage = page.usage or {}
                context.answered += 1
                context.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                context.completion_tokens += int(usage.get("completion_tokens") or 0)
    finally:
        await read.aclose()
    done.sort(key=lambda page: page.index)
    for page in done:
        if (failed := results.failure_of(page)) is not None:
            raise failed
    return done


def _cache(
    gateway: Gateway, request: Request, job: OcrJob, key_name: str | None
) -> cache.PageCache | None:
    """The results cache for the document's pages, unless it is off or the request says
    `Cache-Control: no-cache` (PaddleX's body has no field for it)."""
    if gateway.results is None or not cache.wanted(request.headers.get("cache-control"), True):
        return None
    entry = gateway.pool.served_models().get(job.model)
    wanted = cache.options_of(job, entry)
    return cache.PageCache.scoped(gateway.results, key_name, wanted, gateway.metrics)


async def _visuals(
    gateway: Gateway, source: Source, made: Sequence[Page], read: Sequence[PageResult]
) -> list[Visuals]:
    """Each page's `inputImage` and `outputImages`: its layout drawn (none without one) on the
    page it was found on, and the preprocessing's `preprocessed_img`, in the page workers."""
    drawn = []
    for index, (page, result) in enumerate(zip(made, read, strict=True)):
        boxes = page.result["layout_det_res"]["boxes"] if "layout_det_res" in page.result else None
        steps = page.result.get("doc_preprocessor_res")
        drawn.append(
            gateway.documents.run(
                pages.visualize, source, index, boxes, pages.Corrected.of(result, steps)
            )
        )
    shown: list[Visuals] = await asyncio.gather(*drawn)
    return shown
