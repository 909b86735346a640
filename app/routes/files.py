"""`/v1/files`: batch input files, uploaded as multipart (`purpose=batch`), and batch outputs.

The upload is read as it arrives, spooled to disk past 1 MiB, and refused (413) as soon as it
passes OCRVL_BATCH_MAX_FILE_BYTES; the content is sent back in chunks. A file belongs to its key:
another key's, an unknown and a guessed id all get the same 404.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.responses import Response, StreamingResponse

from app import idempotency, scratch
from app.auth import KeyName
from app.batches.view import file_object
from app.bodies import capped
from app.documents.upload import JSON_OVERHEAD, no_room
from app.errors import InvalidRequest, NotFound, PayloadTooLarge, quoted
from app.quotas import Admitted
from app.state import Gateway, GatewayDep
from app.store.files import FileRecord

router = APIRouter()
PURPOSES = ("batch",)
LIST_LIMIT = (1, 10_000)  # OpenAI's bounds for GET /v1/files


def json_response(value: Any, status: int = 200) -> Response:
    """`value` as a JSON response."""
    return Response(orjson.dumps(value), status, media_type="application/json")


def listed(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object (a cursor page: `after` the last id for the next)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def limit_of(request: Request, default: int, bounds: tuple[int, int]) -> int:
    """The `limit` query parameter, checked (400 naming it)."""
    raw = request.query_params.get("limit") or str(default)
    if not raw.isdigit() or not bounds[0] <= int(raw) <= bounds[1]:
        raise InvalidRequest(
            f"`limit` must be an integer from {bounds[0]} to {bounds[1]}; got {quoted(raw)}",
            param="limit",
        )
    return int(raw)


async def after_of(
    request: Request, owned: Callable[[str], Awaitable[object]], what: str
) -> str | None:
    """The `after` query parameter, if any, checked by `owned` (NotFound: not one of the key's
    `what`, a 400 naming it)."""
    after = request.query_params.get("after") or None
    if after is not None:
        try:
            await owned(after)
        except NotFound:
            raise InvalidRequest(
                f"`after` must be the id of one of this key's {what}; got {quoted(after[:64])}",
                param="after",
            ) from None
    return after


async def _form(request: Request, cap: int) -> tuple[UploadFile, dict[str, str]]:
    """The multipart body's `file` and its other fields; 400/413 otherwise."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidRequest(
            "send the file as multipart/form-data: fields `file` (the JSONL) and `purpose`",
            param="file",
        )
    too_large = PayloadTooLarge(
        f"the upload is over {cap} bytes, what a file may be (OCRVL_BATCH_MAX_FILE_BYTES); "
        "split the requests over several batches",
        param="file",
    )
    stream = capped(request, cap + JSON_OVERHEAD, too_large)
    parser = MultiPartParser(
        request.headers, stream, max_files=1, max_fields=8, max_part_size=JSON_OVERHEAD
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"the multipart body cannot be read: {exc.message}") from None
    except OSError as exc:
        raise no_room(exc) from None
    upload = form.get("file")
    fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
    if not isinstance(upload, UploadFile):
        await form.close()
        raise InvalidRequest("`file` is required: a form field with the JSONL", param="file")
    if (upload.size or 0) > cap:
        await upload.close()
        raise too_large
    return upload, fields


@router.post("/v1/files")
async def upload(request: Request, key: Admitted, gateway: GatewayDep) -> Response:
    """Keep a batch input file; the `file` object (the first file's again for a repeated
    Idempotency-Key: app/idempotency.py)."""
    settings = gateway.settings
    once_key = idempotency.key_of(request)
    upload, fields = await _form(request, settings.batch_max_file_bytes)
    try:
        purpose = fields.get("purpose")
        if purpose not in PURPOSES:
            raise InvalidRequest(
                f"`purpose` must be 'batch' (the only files this gateway keeps); got "
                f"{quoted(purpose)}",
                param="purpose",
            )
        path = await asyncio.to_thread(_spool, upload)
    finally:
        await upload.close()
    name = os.path.basename(upload.filename or "") or "input.jsonl"

    async def keep() -> Response:
        size = await asyncio.to_thread(os.path.getsize, path)
        now = time.time()
        record = FileRecord(
            f"file-{secrets.token_hex(16)}", key, name[:255], "batch", size, now,
            now + settings.job_ttl,
        )  # fmt: skip
        await gateway.batches.files.put(record, path)
        return json_response(file_object(record))

    async def printed() -> str:
        digest = await asyncio.to_thread(idempotency.file_digest, path)
        return idempotency.fingerprint(digest, name, purpose)

    try:
        records = gateway.idempotency
        return await idempotency.once(records, "files", key, once_key, printed=printed, submit=keep)
    finally:
        await asyncio.to_thread(_remove, path)


def _spool(upload: UploadFile) -> Path:
    """The upload in a file of its own (blocking)."""
    handle, name = tempfile.mkstemp(prefix=scratch.prefix("file"))
    with os.fdopen(handle, "wb") as out:
        upload.file.seek(0)
        shutil.copyfileobj(upload.file, out)
    return Path(name)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


async def owned_file(gateway: Gateway, key: str, file_id: str) -> FileRecord:
    """The key's file; the same 404 for another key's, an unknown and a guessed id."""
    record = None
    if file_id.startswith("file-") and len(file_id) <= 64:
        record = await gateway.batches.files.get(file_id)
    if record is None or record.owner != key:
        raise NotFound(f"no file {quoted(file_id[:64])} for this key", param="file_id",
                       code="file_not_found")  # fmt: skip
    return record


@router.get("/v1/files")
async def listing(request: Request, key: KeyName, gateway: GatewayDep) -> Response:
    """The key's files, newest first: `limit` after the file `after`; `purpose` filters."""
    limit = limit_of(request, LIST_LIMIT[1], LIST_LIMIT)
    after = await after_of(request, lambda file_id: owned_file(gateway, key, file_id), "files")
    records = await gateway.batches.files.listing(key, limit + 1, after)
    purpose = request.query_params.get("purpose")
    shown = [file_object(r) for r in records[:limit] if purpose in (None, r.purpose)]
    return json_response(listed(shown, len(records) > limit))


@router.get("/v1/files/{file_id}")
async def retrieve(file_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """The `file` object."""
    return json_response(file_object(await owned_file(gateway, key, file_id)))


@router.get("/v1/files/{file_id}/content")
async def content(file_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """The file's bytes, streamed."""
    record = await owned_file(gateway, key, file_id)
    chunks = gateway.batches.files.content(record.id)
    headers = {"content-length": str(record.bytes)}
    return StreamingResponse(chunks, media_type="application/jsonl", headers=headers)


@router.delete("/v1/files/{file_id}")
async def delete(file_id: str, key: KeyName, gateway: GatewayDep) -> Response:
    """Remove the file (a batch already made from it keeps its own copy)."""
    record = await owned_file(gateway, key, file_id)
    await gateway.batches.files.delete(record.id)
    return json_response({"id": record.id, "object": "file", "deleted": True})
