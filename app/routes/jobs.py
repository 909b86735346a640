"""`/v1/ocr/jobs`: a document as a job: submit (202), poll or long-poll, fetch, cancel, list.

The file is checked as /v1/ocr checks it (sniffed, page count, pixel caps) before the 202, so a
bad file is a 4xx at once, never a failed job; every limit (file size, pages, jobs in progress
per key, stored bytes) is checked before anything is stored. A job belongs to its key: any other
key, an unknown id and a guessed one all get the same 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app import catalog
from app.auth import KeyName
from app.documents import output, upload
from app.documents.errors import DocumentError
from app.documents.raster import Source
from app.errors import InvalidRequest, NotFound, Overloaded, PayloadTooLarge, RateLimited
from app.jobs.view import job_object, page_results
from app.quotas import Admitted
from app.state import Context, Gateway, GatewayDep
from app.store import ACTIVE, Job, new_job_id
from app.store.base import CANCELLED, EXPIRED, ID_PREFIX, QUEUED

router = APIRouter()
MAX_WAIT = 60.0
POLL_EVERY = 0.25  # seconds between store reads while a long-poll waits
LIST_LIMIT = (1, 100)
FULL_RETRY_AFTER = 60


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(value), status, headers, media_type="application/json")


@router.post("/v1/ocr/jobs")
async def submit(
    request: Request, key: Admitted, gateway: GatewayDep, context: Context
) -> Response:
    """Store the (checked) document as a queued job; 202 with the job and its Location."""
    settings, store = gateway.settings, gateway.store
    active = await store.active(key)
    if active >= settings.job_max_active:
        raise RateLimited(
            f"key {key!r} has {active} jobs queued or running, the most OCRVL_JOB_MAX_ACTIVE "
            "allows; wait for one to end, or cancel one (DELETE /v1/ocr/jobs/{id})",
            retry_after=FULL_RETRY_AFTER,
            headers={},
        )
    try:
        received = await upload.read_upload(request, settings.job_max_file_bytes)
    except PayloadTooLarge:  # its message names /v1/ocr's cap
        raise PayloadTooLarge(
            f"the request body is over what a job's file may be: at most "
            f"OCRVL_JOB_MAX_FILE_BYTES ({settings.job_max_file_bytes} bytes)",
            param="file",
        ) from None
    async with contextlib.AsyncExitStack() as cleanup:
        if received.upload is not None:
            cleanup.push_async_callback(received.upload.close)
        options = received.options
        if options.callback_url is not None:
            await gateway.jobs.webhooks.check(options.callback_url)
        data = received.data
        if received.url is not None:
            data = await gateway.media.fetch(received.url, "file")
        context.model = options.model
        context.served_model = _served_model(gateway, options.model)
        spooled = await asyncio.to_thread(upload.spool, received, data, tempfile.gettempdir())
        path = spooled[0]
        cleanup.push_async_callback(asyncio.to_thread, upload.remove, path)  # unless stored
        job = await _checked_job(gateway, key, options, spooled, context.served_model)
        await store.create(job, Path(path))
    gateway.jobs.events.event(job, "created", QUEUED, document_bytes=job.document_bytes)
    location = f"/v1/ocr/jobs/{job.id}"
    return _json(job_object(job), 202, {"location": location})


async def _checked_job(
    gateway: Gateway, key: str, options: upload.OcrOptions, spooled: tuple[str, bytes], model: str
) -> Job:
    """The job for the spooled file, once its size, kind, pages and pixels pass."""
    settings = gateway.settings
    path, head = spooled
    size = await asyncio.to_thread(os.path.getsize, path)
    if size > settings.job_max_file_bytes:
        raise PayloadTooLarge(
            f"`file` is {size} bytes, over OCRVL_JOB_MAX_FILE_BYTES "
            f"({settings.job_max_file_bytes})",
            param="file",
        )
    try:
        source = Source.sniffed(path, head, options.dpi, settings)
        pages = await gateway.documents.inspect(source, options.pages, settings.job_max_pages)
    except DocumentError as exc:
        if exc.code == "too_many_pages":
            raise InvalidRequest(
                f"the document has more pages than a job may have: at most "
                f"{settings.job_max_pages} (OCRVL_JOB_MAX_PAGES); choose some with `pages`",
                param="pages",
                code="too_many_pages",
            ) from None
        raise exc.as_gateway_error() from None
    stored = await gateway.store.stored_bytes()
    if stored + size > settings.job_max_stored_bytes:
        raise Overloaded(
            f"the job store is full: {stored} bytes of documents kept, and this one's {size} "
            f"would pass OCRVL_JOB_MAX_STORED_BYTES ({settings.job_max_stored_bytes}); retry "
            f"after {FULL_RETRY_AFTER} s, once running jobs have finished their documents",
            retry_after=FULL_RETRY_AFTER,
        )
    if gateway.usage is not None:  # the whole document against the key's page budgets
        await gateway.usage.check(key, len(pages))
    spec = {
        "pages": pages, "task": options.task, "dpi": options.dpi,
        "max_tokens": options.max_tokens, "model": options.model, "served_model": model,
        "kind": source.kind.name, "mime": source.kind.mime, "min_pixels": source.min_pixels,
        "max_pixels": source.max_pixels, "max_page_pixels": source.max_page_pixels,
        "callback_url": options.callback_url,
    }  # fmt: skip
    return Job(new_job_id(), key, spec, len(pages), size, time.time())


def _served_model(gateway: Gateway, requested: str | None) -> str:
    served_models = gateway.pool.require_models("to read the document")
    return catalog.resolve(requested, served_models) if requested else next(iter(served_models))


async def _owned(gateway: Gateway, key: str, job_id: str) -> Job:
    """The key's job `job_id`; the same 404 for another key's, an unknown and a guessed id."""
    job = None
    if job_id.startswith(ID_PREFIX) and len(job_id) <= 64:
        job = await gateway.store.get(job_id)
    if job is None or job.owner != key:
        raise NotFound(f"no job {job_id[:64]!r} for this key", param="id", code="job_not_found")
    return job


def _wait_seconds(raw: str | None) -> float:
    if raw is None or raw == "":
        return 0.0
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT:  # NaN fails too
        raise InvalidRequest(
            f"`wait` must be a number of seconds from 0 to {MAX_WAIT:g}; got {raw[:40]!r}",
            param="wait",
            code="invalid_wait",
        )
    return wait


@router.get("/v1/ocr/jobs/{job_id}")
async def status(request: Request, job_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """The job; `?wait=N` holds the answer up to N s until its status changes or it ends."""
    wait = _wait_seconds(request.query_params.get("wait"))
    job = await _owned(gateway, key, job_id)
    deadline = time.monotonic() + wait
    seen = job.status
    while job.status == seen and job.status in ACTIVE and time.monotonic() < deadline:
        await asyncio.sleep(min(POLL_EVERY, max(deadline - time.monotonic(), 0)))
        job = await _owned(gateway, key, job_id)
    return _json(job_object(job))


@router.get("/v1/ocr/jobs/{job_id}/result")
async def result(request: Request, job_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """The pages kept so far, in /v1/ocr's forms (JSON, NDJSON, markdown by `Accept`)."""
    job = await _owned(gateway, key, job_id)
    if job.status in (CANCELLED, EXPIRED):
        raise NotFound(
            f"job {job_id} is {job.status}: its results were removed",
            param="id",
            code="job_results_removed",
        )
    pages = page_results(await gateway.store.pages(job_id))
    model = str(job.spec.get("served_model"))
    media_type = output.negotiate(request.headers.get("accept", ""), stream=False)
    headers = {**output.summary_headers(pages), "x-ocr-job-status": job.status}
    if media_type == output.NDJSON:
        numbers = [index + 1 for index in job.spec["pages"]]
        stream = output.PageStream(model, numbers, _each(pages), contextlib.AsyncExitStack())
        stream.headers.update(headers)
        return stream
    if media_type == output.MARKDOWN:
        body = output.markdown(pages)
        return Response(body, media_type="text/markdown; charset=utf-8", headers=headers)
    return _json(output.document(model, pages), headers=headers)


async def _each(pages: list[Any]) -> Any:
    for page in pages:
        yield page


@router.delete("/v1/ocr/jobs/{job_id}")
async def cancel(job_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """Cancel a queued or running job (its pages in flight are aborted) and delete its
    document and results; an ended job is deleted whole."""
    job = await _owned(gateway, key, job_id)
    store, now = gateway.store, time.time()
    changes = {"finished_at": now, "expires_at": now + gateway.settings.job_ttl}
    if job.status in ACTIVE and await store.transition(job_id, ACTIVE, CANCELLED, changes):
        gateway.jobs.cancel(job_id)  # here at once; another replica at its next renewal
        await store.drop_document(job_id)
        await store.drop_pages(job_id)
        job = await store.get(job_id) or job
        gateway.jobs.events.event(job, "cancelled", CANCELLED, pages_done=job.pages_done)
    else:
        await store.delete(job_id)
        gateway.jobs.events.event(job, "deleted")
    return _json({**job_object(job), "deleted": True})


@router.get("/v1/ocr/jobs")
async def listing(request: Request, key: KeyName, gateway: GatewayDep) -> Response:
    """The key's jobs, newest first: `limit` (1-100, default 20) after the job `after`."""
    raw = request.query_params.get("limit") or "20"
    if not raw.isdigit() or not LIST_LIMIT[0] <= int(raw) <= LIST_LIMIT[1]:
        raise InvalidRequest(
            f"`limit` must be an integer from 1 to 100; got {raw[:20]!r}", param="limit"
        )
    limit, after = int(raw), request.query_params.get("after") or None
    jobs = await gateway.store.listing(key, limit + 1, after)
    shown = [job_object(job) for job in jobs[:limit]]
    return _json(
        {
            "object": "list",
            "data": shown,
            "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None,
            "has_more": len(jobs) > limit,
        }
    )
