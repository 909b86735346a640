"""`Idempotency-Key` on submissions (`POST /v1/ocr/jobs`, `/v1/batches`, `/v1/files`).

The IETF httpapi draft's header: a client that sends a submission again with the same key gets
the first answer back (the same job, batch or file), not a second one. Per API key name and
route, kept OCRVL_IDEMPOTENCY_TTL (24 h). The request is told apart by a fingerprint of what it
asks (the file's SHA-256 and the options: never the multipart boundary, which a retry changes):

    same key, same request, answered     the first answer again (`idempotent-replayed: true`)
    same key, same request, in progress  409 idempotency_key_in_use (retry after 1 s)
    same key, another request            422 idempotency_key_reused
    malformed or over 255 characters     400 naming the header

A submission that fails (any 4xx or 5xx) leaves no record: the key may be sent again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from app.errors import IdempotencyConflict, IdempotencyMismatch, InvalidRequest, quoted
from app.store.idempotency import Idempotency, Record

HEADER = "Idempotency-Key"
MAX_LENGTH = 255
REPLAYED = "idempotent-replayed"
KEPT_HEADERS = ("location",)


def key_of(request: Request) -> str | None:
    """The request's Idempotency-Key (an sf-string, `"..."`, or the bare value many clients
    send), or None; 400 naming the header when it is malformed."""
    values = request.headers.getlist(HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise _malformed("it is sent more than once")
    raw = values[0].strip()
    value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
    if not value:
        raise _malformed("it is empty")
    if len(value) > MAX_LENGTH:
        raise _malformed(f"it has {len(value)} characters, over {MAX_LENGTH}")
    if any(not 0x20 <= ord(c) <= 0x7E or c in '"\\' for c in value):
        raise _malformed(
            f"it may hold only printable ASCII, no quote or backslash; got {quoted(value)}"
        )
    return value


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(
        f"the {HEADER} header is malformed: {why}; send one value of 1 to {MAX_LENGTH} printable "
        'ASCII characters, e.g. Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"',
        param=HEADER,
        code="invalid_idempotency_key",
    )


def file_digest(path: str | Path) -> bytes:
    """The SHA-256 of a spooled file (blocking: run it in a thread)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.digest()


def fingerprint(*parts: Any) -> str:
    """A SHA-256 of what the request asks (JSON-able parts, bytes as they are)."""
    digest = hashlib.sha256()
    for part in parts:
        data = (
            part
            if isinstance(part, bytes)
            else orjson.dumps(part, option=orjson.OPT_SORT_KEYS, default=repr)
        )
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


async def once(
    records: Idempotency | None,
    route: str,
    owner: str,
    key: str | None,
    *,
    printed: Callable[[], Awaitable[str]] | str,
    submit: Callable[[], Awaitable[Response]],
) -> Response:
    """`submit()`'s answer, or (with `key`) the first answer of the same request under it."""
    if key is None or records is None:
        return await submit()
    wanted = printed if isinstance(printed, str) else await printed()
    name = f"{route} {key}"
    found = await records.claim(owner, name, wanted, time.time())
    if found is not None:
        return _replayed(found, wanted, key)
    try:
        response = await submit()
    except BaseException:
        await records.forget(owner, name)
        raise
    if response.status_code >= 300:
        await records.forget(owner, name)
        return response
    headers = {k: v for k, v in response.headers.items() if k in KEPT_HEADERS}
    await records.complete(
        owner, name, Record(wanted, False, response.status_code, bytes(response.body), headers)
    )
    return response


def _replayed(found: Record, wanted: str, key: str) -> Response:
    """The first answer, or why there is none to give."""
    if found.fingerprint != wanted:
        raise IdempotencyMismatch(
            f"{HEADER} {quoted(key)} was used with another request (another file or other "
            "options) in the last 24 h; use a new key for a new request",
            param=HEADER,
        )
    if found.pending:
        raise IdempotencyConflict(
            f"a request with {HEADER} {quoted(key)} is still being accepted; retry shortly to "
            "get its answer",
            param=HEADER,
        )
    headers = {**found.headers, REPLAYED: "true"}
    return Response(found.body, found.status, headers, media_type="application/json")
