"""Request bodies, read with a cap: refused with 413 before the cap is passed, not after."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.requests import Request

from app.errors import PayloadTooLarge


async def capped(request: Request, limit: int, too_large: PayloadTooLarge) -> AsyncGenerator[bytes]:
    """The body's chunks; `too_large` as soon as the declared or the read size passes `limit`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        yield chunk
