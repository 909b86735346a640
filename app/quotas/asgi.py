"""Where requests meet the limits: the route dependency.

A stream's body is sent after its endpoint returns, so the concurrency slot cannot be given
back by the endpoint. `admit` hands the grant's headers and release to the request's context
instead; the context middleware (app/context.py) wraps the whole ASGI call, adds the headers to
the answer and releases in its `finally`, once the last byte went out, after an error response,
or when the client left.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.auth import KeyName
from app.context import RequestContext
from app.quotas.limiter import Quotas


async def admit(request: Request, key_name: KeyName) -> str:
    """Dependency: the authenticated key's name, once its limits admit the request (else 429).

    Async on purpose: see app/state.py.
    """
    quotas: Quotas = request.state.gateway.quotas
    grant = await quotas.admit(key_name)
    if grant is not None:
        context: RequestContext = request.state.context
        context.response_headers = grant.headers
        context.release = grant.release
    return key_name


async def widen(request: Request, key_name: str, pages: int) -> None:
    """A request admitted as one page counts as `pages` (`n` > 1): the other slots and RPM
    hits join the grant the context releases (429 as `admit` would, the first slot too)."""
    if pages <= 1:
        return
    quotas: Quotas = request.state.gateway.quotas
    grant = await quotas.widen(key_name, pages)
    if grant is None:
        return
    context: RequestContext = request.state.context
    if grant.headers:
        context.response_headers = grant.headers
    if grant.release is not None:
        context.on_release(grant.release)


Admitted = Annotated[str, Depends(admit)]
