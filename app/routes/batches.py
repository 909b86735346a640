"""`/v1/batches`: OpenAI's Batch API over a `/v1/files` JSONL, run as a background job.

Create checks what OpenAI checks at once (the endpoint, the completion window, the input file:
the key's own, `purpose=batch`) and answers `validating`; the file's lines are checked by the
runner (app/batches/lines.py), which fails the batch with `errors` rather than answering 400.
A line has no headers of its own, so a batch asks for chat's loop guard as a whole: `metadata`'s
`ocrvl_loop_guard`, else the create request's `X-OCRVL-Loop-Guard` (`on`, `off`); neither, and
OCRVL_CHAT_LOOP_GUARD decides as each line runs (docs/loops.md).
A batch belongs to its key: another key's, an unknown and a guessed id all get the same 404.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from app import idempotency, scratch
from app.auth import KeyName
from app.batches.lines import ENDPOINTS
from app.batches.view import batch_object
from app.bodies import capped
from app.errors import InvalidRequest, NotFound, PayloadTooLarge, RateLimited, quoted
from app.quotas import Admitted
from app.routes.chat import LOOP_GUARD_HEADER, guard_switch
from app.routes.files import after_of, json_response, limit_of, listed, owned_file
from app.state import Gateway, GatewayDep
from app.store import ACTIVE, Job
from app.store.base import CANCELLED, QUEUED

router = APIRouter()
WINDOWS = {"24h": 86_400}
BODY_LIMIT = 64 * 1024
LIST_LIMIT = (1, 100)
FULL_RETRY_AFTER = 60
GUARD_KEY = "ocrvl_loop_guard"  # the metadata key by which a batch asks for the loop guard
NO_OCR = (
    "/v1/ocr lines are not taken: OpenAI's batch format has no line shape for a multipart "
    "document upload; send each page as a chat completion"
)


async def _body(request: Request) -> dict[str, Any]:
    too_large = PayloadTooLarge(f"a batch's create body may be at most {BODY_LIMIT} bytes")
    raw = b"".join([chunk async for chunk in capped(request, BODY_LIMIT, too_large)])
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _checked(body: dict[str, Any]) -> tuple[str, str, str, dict[str, str] | None]:
    """(input_file_id, endpoint, completion_window, metadata), or 400 naming the field."""
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        more = f"; {NO_OCR}" if endpoint == "/v1/ocr" else ""
        raise InvalidRequest(
            f"`endpoint` must be one of {', '.join(ENDPOINTS)}; got {quoted(endpoint)}{more}",
            param="endpoint",
            code="invalid_endpoint",
        )
    window = body.get("completion_window")
    if not isinstance(window, str) or window not in WINDOWS:  # a list or object is no key
        raise InvalidRequest(
            f"`completion_window` must be '24h'; got {quoted(window)}",
            param="completion_window",
            code="invalid_value",
        )
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise InvalidRequest(
            "`input_file_id` is required: a file's id",
            param="input_file_id",
            code="missing_required_parameter",
        )
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items())
    ):
        raise InvalidRequest(
            "`metadata` must be an object of at most 16 string values (keys up to 64 "
            "characters, values up to 512)",
            param="metadata",
        )
    return file_id, str(endpoint), str(window), metadata


def _switch(value: str | None, param: str, name: str) -> str | None:
    """`on` or `off` (the loop guard's switch, as chat's header takes it), None when not given,
    or 400 naming `param`."""
    return None if value is None else guard_switch(value, param, name)


@router.post("/v1/batches")
async def create(request: Request, key: Admitted, gateway: GatewayDep) -> Response:
    """A batch of the key's input file, `validating` until the runner has read it (the first
    batch's answer again for a repeated Idempotency-Key: app/idempotency.py)."""
    once_key = idempotency.key_of(request)
    header = request.headers.get(LOOP_GUARD_HEADER)
    guard = _switch(header, LOOP_GUARD_HEADER, f"the {LOOP_GUARD_HEADER} header")
    body = await _body(request)
    return await idempotency.once(
        gateway.idempotency, "batches", key, once_key,
        printed=idempotency.fingerprint(body), submit=lambda: _create(body, key, gateway, guard),
    )  # fmt: skip


async def _create(body: dict[str, Any], key: str, gateway: Gateway, guard: str | None) -> Response:
    """The batch made and kept; `guard`: the create request's loop guard header, if any."""
    file_id, endpoint, window, metadata = _checked(body)
    asked = (metadata or {}).get(GUARD_KEY)
    guard = _switch(asked, "metadata", f"`metadata.{GUARD_KEY}`") or guard
    record = await owned_file(gateway, key, file_id)
    if record.purpose != "batch":
        raise InvalidRequest(
            f"file {file_id} has purpose {record.purpose!r}; a batch reads a file uploaded "
            "with purpose 'batch'",
            param="input_file_id",
        )
    store, settings = gateway.batches.store, gateway.settings
    active = await store.active(key)
    if active >= settings.job_max_active:
        raise RateLimited(
            f"key {key!r} has {active} batches in progress, the most OCRVL_JOB_MAX_ACTIVE "
            "allows; wait for one to end, or cancel one",
            retry_after=FULL_RETRY_AFTER,
            headers={},
        )
    handle, name = await asyncio.to_thread(tempfile.mkstemp, prefix=scratch.prefix("lines"))
    await asyncio.to_thread(os.close, handle)
    path = Path(name)
    try:
        if not await gateway.batches.files.copy(record.id, path):
            raise NotFound(f"file {file_id} is gone", param="input_file_id")
        now = time.time()
        spec = {
            "input_file_id": record.id, "endpoint": endpoint, "completion_window": window,
            "metadata": metadata, "window_ends": now + WINDOWS[window], "loop_guard": guard,
        }  # fmt: skip
        batch = Job(f"batch_{secrets.token_urlsafe(16)}", key, spec, 0, record.bytes, now)
        await store.create(batch, path)
    finally:
        await asyncio.to_thread(path.unlink, missing_ok=True)
    return json_response(batch_object(batch))


async def _owned(gateway: Gateway, key: str, batch_id: str) -> Job:
    """The key's batch; the same 404 for another key's, an unknown and a guessed id."""
    batch = None
    if batch_id.startswith("batch_") and len(batch_id) <= 64:
        batch = await gateway.batches.store.get(batch_id)
    if batch is None or batch.owner != key:
        raise NotFound(
            f"no batch {quoted(batch_id[:64])} for this key",
            param="batch_id",
            code="batch_not_found",
        )
    return batch


@router.get("/v1/batches/{batch_id}")
async def retrieve(batch_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """The `batch` object."""
    return json_response(batch_object(await _owned(gateway, key, batch_id)))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel(batch_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """`cancelling`: the lines in flight are stopped, then the batch is `cancelled` with what
    finished in its files (at once when it had not started)."""
    runner = gateway.batches
    batch = await _owned(gateway, key, batch_id)
    if batch.status not in ACTIVE:
        raise InvalidRequest(
            f"batch {batch_id} is {batch_object(batch)['status']}: only a batch in progress "
            "can be cancelled",
            param="batch_id",
            code="batch_not_cancellable",
        )
    now = time.time()
    extra = {**batch.extra, "cancelling_at": now}
    changes = {"extra": extra, "expires_at": now + gateway.settings.job_ttl}  # swept even so
    if await runner.store.transition(batch_id, ACTIVE, CANCELLED, changes):
        runner.cancel(batch_id)  # here at once; another replica at its next renewal
        if batch.status == QUEUED:  # nobody ran it: `cancelled` at once
            await runner.finish_cancelled(batch_id)
    return json_response(batch_object(await _owned(gateway, key, batch_id)))


@router.get("/v1/batches")
async def listing(request: Request, key: KeyName, gateway: GatewayDep) -> Response:
    """The key's batches, newest first: `limit` (1-100, default 20) after the batch `after`."""
    limit = limit_of(request, 20, LIST_LIMIT)
    after = await after_of(request, lambda batch_id: _owned(gateway, key, batch_id), "batches")
    batches = await gateway.batches.store.listing(key, limit + 1, after)
    shown = [batch_object(batch) for batch in batches[:limit]]
    return json_response(listed(shown, len(batches) > limit))
