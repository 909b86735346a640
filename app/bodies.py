"""Request bodies, read with a cap: refused with 413 before the cap is passed, not after."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.requests import ClientDisconnect, Request

from app.errors import ClientClosed, PayloadTooLarge

# What uvicorn buffers of a body before it stops reading the socket until the app takes it:
# its own 64 KiB made a page arrive in many steps, each a pause and a resume of the socket and
# a wake-up of the request; with this a typical page (0.3-1.5 MB) arrives in one or two.
READ_AHEAD = 1024 * 1024


def read_ahead(limit: int = READ_AHEAD) -> None:
    """Let uvicorn's httptools protocol buffer up to `limit` bytes of a request body before
    it pauses reading (for `ocrvl serve`; the request still reads it through `capped`)."""
    from uvicorn.protocols.http import flow_control, httptools_impl  # noqa: PLC0415

    # on_body compares against the module's own imported copy of the constant
    limit = max(flow_control.HIGH_WATER_LIMIT, limit)
    httptools_impl.HIGH_WATER_LIMIT = limit  # type: ignore[attr-defined]


async def capped(request: Request, limit: int, too_large: PayloadTooLarge) -> AsyncGenerator[bytes]:
    """The body's chunks (none empty: a body that came whole is one chunk, joined without a
    copy); `too_large` as soon as the declared or the read size passes `limit`; ClientClosed
    (logged as 499) when the client leaves before the body is whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    size = 0
    try:
        async for chunk in request.stream():
            if not chunk:
                continue
            size += len(chunk)
            if size > limit:
                raise too_large
            yield chunk
    except ClientDisconnect:
        raise ClientClosed(
            f"the client closed the connection after {size} bytes of its request body"
        ) from None
