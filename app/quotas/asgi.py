"""Where requests meet the limits: the route dependency and the middleware that releases.

A stream's body is sent after its endpoint returns, so the concurrency slot cannot be given
back by the endpoint. The middleware wraps the whole ASGI call instead: its `finally` runs
once the last byte went out, after an error response, or when the client left.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.auth import KeyName
from app.quotas.limiter import Grant, Quotas

GRANT = "quota_grant"  # the request state's slot for what `admit` granted


async def admit(request: Request, key_name: KeyName) -> str:
    """Dependency: the authenticated key's name, once its limits admit the request (else 429).

    Async on purpose: see app/state.py.
    """
    quotas: Quotas = request.state.gateway.quotas
    grant = await quotas.admit(key_name)
    if grant is not None:
        setattr(request.state, GRANT, grant)
    return key_name


Admitted = Annotated[str, Depends(admit)]


class QuotaMiddleware:
    """Adds an admitted request's x-ratelimit-* headers and releases its slot at the very end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                grant: Grant | None = state.get(GRANT)
                if grant is not None and grant.headers:
                    message["headers"] = [*message.get("headers", ()), *grant.headers]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            grant = state.pop(GRANT, None)
            if grant is not None and grant.release is not None:
                await grant.release()
