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

from app import catalog, idempotency, policy
from app.auth import KeyName
from app.documents import cache, layouts, output, upload
from app.documents.errors import DocumentError
from app.documents.raster import Source
from app.errors import InvalidRequest, NotFound, Overloaded, PayloadTooLarge, RateLimited
from app.jobs.pages import ocr_job
from app.jobs.view import job_object, page_results
from app.quotas import Admitted
from app.routes.files import after_of, limit_of, listed
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
    """Store the (checked) document as a queued job; 202 with the job and its Location (the
    first job's again for a repeated Idempotency-Key: app/idempotency.py)."""
    settings, store = gateway.settings, gateway.store
    once_key = idempotency.key_of(request)
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
        entry = gateway.pool.served_models().get(context.served_model)  # as /v1/ocr checks it
        policy.check({"max_tokens": options.max_tokens}, settings, policy.model_length(entry))
        spooled = await asyncio.to_thread(upload.spool, received, data, tempfile.gettempdir())
        path = spooled[0]
        cleanup.push_async_callback(asyncio.to_thread, upload.remove, path)  # unless stored
        served = context.served_model

        async def accept() -> Response:
            job = await _checked_job(gateway, key, options, spooled, served)
            if gateway.results is not None and cache.wanted(
                request.headers.get("cache-control"), options.cache
            ):  # what the job's pages are cached under, the model's revision now included
                entry = gateway.pool.served_models().get(served)
                job.spec["cache"] = cache.options_of(ocr_job(job, path), entry)
            await _stored(gateway, job, Path(path))
            gateway.jobs.events.event(job, "created", QUEUED, document_bytes=job.document_bytes)
            return _json(job_object(job), 202, {"location": f"/v1/ocr/jobs/{job.id}"})

        async def printed() -> str:
            digest = await asyncio.to_thread(idempotency.file_digest, path)
            return idempotency.fingerprint(digest, options)

        records = gateway.idempotency
        return await idempotency.once(
            records, "jobs", key, once_key, printed=printed, submit=accept
        )


async def _checked_job(
    gateway: Gateway, key: str, options: upload.OcrOptions, spooled: tuple[str, bytes], model: str
) -> Job:
    """The job for the spooled file, once its size, kind, pages and pixels pass. With
    `layout` auto or on and a layout service configured, its pages are read block by block;
    they wait for the service as they wait for backends (docs/jobs.md)."""
    settings = gateway.settings
    mode, wanted = options.layout, options.layout_options
    layout, _ = layouts.choose(gateway.layouts, mode, wanted, waits=True, task=options.task)
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
    spec = {
        "pages": pages, "task": options.task, "dpi": options.dpi,
        "max_tokens": options.max_tokens, "model": options.model, "served_model": model,
        "kind": source.kind.name, "mime": source.kind.mime, "min_pixels": source.min_pixels,
        "max_pixels": source.max_pixels, "max_page_pixels": source.max_page_pixels,
        "callback_url": options.callback_url,
        "layout": layout.as_dict() if layout is not None else None,
        "model_len": policy.model_length(gateway.pool.served_models().get(model)),
        "loops": options.loops or gateway.settings.loops,
    }  # fmt: skip
    return Job(new_job_id(), key, spec, len(pages), size, time.time())


async def _stored(gateway: Gateway, job: Job, document: Path) -> None:
    """Reserve the job's pages under the key's page budgets (429 when they do not fit), then
    keep it; the runner gives back what is not answered when the job ends (docs/limits.md)."""
    meter = gateway.usage
    reservation = None if meter is None else await meter.reserve(job.owner, job.pages_total)
    job.spec["reserved"] = reservation
    try:
        await gateway.store.create(job, document)
    except BaseException:
        if meter is not None:
            await meter.release(job.owner, reservation, 0)
        raise


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
    if job.status == EXPIRED:
        raise NotFound(
            f"job {job_id} is {job.status}: its results were removed",
            param="id",
            code="job_results_removed",
        )
    pages = page_results(await gateway.store.pages(job_id))
    model = str(job.spec.get("served_model"))
    media_type = output.negotiate(request.headers.get("accept", ""), stream=False)
    mode = output.layout_fields(bool(job.spec.get("layout")))
    headers = {**output.summary_headers(pages), "x-ocr-job-status": job.status}
    headers |= output.layout_headers(mode)
    if gateway.results is not None:  # of the pages kept so far
        headers["x-ocrvl-cache"] = cache.state(pages, isinstance(job.spec.get("cache"), dict))
    if media_type == output.NDJSON:
        numbers = [index + 1 for index in job.spec["pages"]]
        cleanup = contextlib.AsyncExitStack()
        stream = output.PageStream(model, numbers, _each(pages), cleanup, mode)
        stream.headers.update(headers)
        return stream
    if media_type == output.MARKDOWN:
        body = output.markdown(pages)
        return Response(body, media_type="text/markdown; charset=utf-8", headers=headers)
    return _json(output.document(model, pages, mode), headers=headers)


async def _each(pages: list[Any]) -> Any:
    for page in pages:
        yield page


@router.delete("/v1/ocr/jobs/{job_id}")
async def cancel(job_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """Cancel a queued or running job: its pages in flight are aborted, its document deleted,
    the pages it finished kept until OCRVL_JOB_TTL (as OpenAI's batches keep what was done),
    its unanswered pages given back to the key's budget. An ended job is deleted whole."""
    job = await _owned(gateway, key, job_id)
    store, now = gateway.store, time.time()
    changes = {"finished_at": now, "expires_at": now + gateway.settings.job_ttl}
    if job.status in ACTIVE and await store.transition(job_id, ACTIVE, CANCELLED, changes):
        gateway.jobs.cancel(job_id)  # here at once; another replica at its next renewal
        await store.drop_document(job_id)
        job = await store.get(job_id) or job  # no page is kept after the transition
        await gateway.jobs.release(job)
        gateway.jobs.events.event(job, "cancelled", CANCELLED, pages_done=job.pages_done)
    else:
        await store.delete(job_id)
        gateway.jobs.events.event(job, "deleted")
    return _json({**job_object(job), "deleted": True})


@router.get("/v1/ocr/jobs")
async def listing(request: Request, key: KeyName, gateway: GatewayDep) -> Response:
    """The key's jobs, newest first: `limit` (1-100, default 20) after the job `after`."""
    limit = limit_of(request, 20, LIST_LIMIT)
    # another key's job id is refused like an unknown one: it confirms nothing of that job
    after = await after_of(request, lambda job_id: _owned(gateway, key, job_id), "jobs")
    jobs = await gateway.store.listing(key, limit + 1, after)
    shown = [job_object(job) for job in jobs[:limit]]
    return _json(listed(shown, len(jobs) > limit))
