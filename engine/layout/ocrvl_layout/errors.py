"""The layout service's exception tree, and the handlers that give every error OpenAI's shape.

    LayoutError                      any error the service answers itself
    ├── WorkerLost           500     a worker process died twice on the request's pages
    ├── InvalidRequest       400     not JSON, no images, a bad override, an image that is not one
    ├── PayloadTooLarge      413     the body is over --max-request-bytes
    ├── ClientClosed         499     the client left before its body was whole (nobody reads it)
    ├── NotReady             503     the model is still loading or warming up (Retry-After)
    └── Overloaded           503     the queue of pages is full (Retry-After)

Every body is `{"error": {"message", "type", "param", "code"}}`, as the gateway's.
"""

from __future__ import annotations

from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

QUOTE_LIMIT = 200


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for a message, cut past `limit` characters (a client's 2 MB string stays
    out of the answer and the log)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class LayoutError(Exception):
    """An error the layout service answers in OpenAI's shape."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        """Headers that tell a client how to react."""
        return {}


class InvalidRequest(LayoutError):
    """The body is not a layout request this service can run."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class WorkerLost(LayoutError):
    """A worker process (workers.py) died on a call, and again on its one retry."""

    code = "worker_lost"


class NotLoaded(InvalidRequest):
    """A step the request asks for whose model this service was not started with."""

    code = "model_not_loaded"


class PayloadTooLarge(LayoutError):
    """The body is larger than --max-request-bytes."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ClientClosed(LayoutError):
    """The client closed its connection before the whole body came (a load client stopping,
    a gateway whose request was cancelled): nothing to answer, and no server error."""

    status = 499
    type = "client_closed"
    code = "client_closed"


class Unavailable(LayoutError):
    """The service cannot take the request now; `Retry-After` says when to try again."""

    status = 503

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(retry_after, 1)

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)}


class NotReady(Unavailable):
    """The model is loading or warming up."""

    code = "not_ready"


class Overloaded(Unavailable):
    """More pages wait than --max-queue allows."""

    code = "server_overloaded"


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


async def _layout_error(_: Request, error: Exception) -> Response:
    exc = cast(LayoutError, error)
    body = error_body(exc.message, exc.type, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers())


async def _http_error(_: Request, error: Exception) -> Response:
    exc = cast(StarletteHTTPException, error)
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = "not_found" if exc.status_code == 404 else None
    body = error_body(str(exc.detail), type_, None, code)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _validation_error(_: Request, error: Exception) -> Response:
    exc = cast(RequestValidationError, error)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    return await _layout_error(_, invalid_from_pydantic(first))


def invalid_from_pydantic(error: Any) -> InvalidRequest:
    """One pydantic error as an InvalidRequest naming its field (`threshold.3`, `images.0`)."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = ".".join(location)[:QUOTE_LIMIT] or None
    message = f"{param or 'request'}: {error.get('msg', 'invalid value')}"
    if "input" in error and error.get("type") not in {"missing"}:
        message += f" (got {quoted(error['input'], 80)})"
    return InvalidRequest(message, param=param)


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error OpenAI's body shape."""
    app.add_exception_handler(LayoutError, _layout_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
