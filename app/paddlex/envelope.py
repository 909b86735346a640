"""PaddleX's serving envelope: `{"logId", "result", "errorCode": 0, "errorMsg": "Success"}`,
and on error `{"logId", "errorCode": <the HTTP status>, "errorMsg"}`.

`PaddleXRoute` wraps a route's whole handler, its dependencies included, so every error on
these routes (a missing key, a spent budget, a full queue, a bad file) keeps the status and the
headers (`Retry-After`, `x-ratelimit-*`) the gateway gives it elsewhere and comes in PaddleX's
envelope. A request the server cannot take is a 422, as PaddleX's own server answers one (the
gateway's 400s). `logId` is the request's own when it sent one (PaddleX's `_try_get_log_id`),
else the gateway's request id written as a UUID, so the log line and the answer share it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from app.context import RequestContext
from app.errors import GatewayError

log = logging.getLogger("ocrvl.paddlex")
INVALID = 422  # PaddleX's status for every request it cannot take
LOG_ID = "paddlex_log_id"  # where a route keeps the request's `logId` (request.state)


def log_id(request: Request) -> str:
    """The request's `logId`, or the gateway's request id as a UUID."""
    given = getattr(request.state, LOG_ID, None)
    if isinstance(given, str):
        return given
    context: RequestContext | None = getattr(request.state, "context", None)
    if context is None:
        return str(uuid.uuid4())
    try:
        return str(uuid.UUID(hex=context.request_id))
    except ValueError:
        return context.request_id


async def success(request: Request, result: dict[str, Any]) -> Response:
    """200 with `result` in the envelope (written in a thread: with its page images a document's
    answer runs to megabytes)."""
    body = {"logId": log_id(request), "result": result, "errorCode": 0, "errorMsg": "Success"}
    return Response(await asyncio.to_thread(orjson.dumps, body), media_type="application/json")


def failure(
    request: Request, status: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    """An error in the envelope; `errorCode` is the HTTP status."""
    body = {"logId": log_id(request), "errorCode": status, "errorMsg": message}
    return Response(
        orjson.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


class PaddleXRoute(APIRoute):
    """A route whose every error, its dependencies' too, is answered in PaddleX's envelope."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler (dependencies, then the endpoint), its errors enveloped."""
        handler = super().get_route_handler()

        async def enveloped(request: Request) -> Response:
            try:
                return await handler(request)
            except GatewayError as exc:
                status = INVALID if exc.status == 400 else exc.status
                message = exc.message if exc.code is None else f"{exc.message} ({exc.code})"
                return failure(request, status, message, exc.headers())
            except Exception:
                log.exception("unhandled error on %s", request.url.path)
                return failure(request, 500, "Internal server error")

        return enveloped
