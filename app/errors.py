"""The gateway's one exception tree, and the handlers that turn it into OpenAI error bodies.

    GatewayError                     any error the gateway answers itself
    ├── InvalidRequest       400     malformed JSON, not a chat request (names `param`)
    ├── AuthenticationFailed 401     missing or unknown API key
    ├── ModelNotFound        404     model neither served nor an alias
    ├── NotFound             404     no such job for this key
    ├── IdempotencyConflict  409     a submission with this Idempotency-Key is being accepted
    ├── PayloadTooLarge      413     body over OCRVL_MAX_BODY_BYTES
    ├── IdempotencyMismatch  422     the Idempotency-Key was used with another request
    ├── RateLimited          429     the key's requests per minute or concurrency is used up
    ├── BudgetExhausted      429     the key's pages per day or month would be passed
    ├── ClientClosed         499     the client left first (logged; nobody reads the body)
    ├── Overloaded           503     admission queue full, or waited OCRVL_QUEUE_TIMEOUT
    └── UpstreamError                the backend could not give an answer
        ├── BackendUnavailable   502/503  refused, reset, or no healthy backend
        │   └── LayoutUnavailable    503  no layout service ready, or it failed or was slow
        ├── BackendTimeout       504      OCRVL_REQUEST_TIMEOUT ran out
        └── BackendRejected      4xx/5xx  the backend's own error, passed on

Every body has OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so the OpenAI
SDK raises its matching exception (`AuthenticationError`, `NotFoundError`, …).
"""

from __future__ import annotations

import math
from typing import Any, cast

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

# What a message or log field repeats of a client's input (a model name, a URL, a form value),
# and of a backend's own error message: cut past these lengths, its full length stated, so a
# 2 MB `model` gives neither a 2 MB answer nor a 2 MB log line (docs/clients.md).
QUOTE_LIMIT = 200
MESSAGE_LIMIT = 1000


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text`, or its first `limit` characters and how many it had."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for a message, cut as `clip` cuts (the length stated is the value's)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:limit]}... ({size} characters)"


class GatewayError(Exception):
    """An error the gateway answers in OpenAI's shape."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error body for this error."""
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        """Response headers that tell clients how to react (the OpenAI SDK reads them)."""
        return {}


class InvalidRequest(GatewayError):
    """The request is not one the gateway can serve; `code` says which mistake (never null:
    the same mistake has the same code on every route, docs/clients.md)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    """No API key, or one the gateway does not know."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotFound(GatewayError):
    """The requested model is neither served by a backend nor a known alias."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(GatewayError):
    """No such resource for this key (a job of another key, an unknown or guessed id)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class IdempotencyConflict(GatewayError):
    """A submission with the same Idempotency-Key is still being accepted (app/idempotency.py)."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"

    def headers(self) -> dict[str, str]:
        """The first is accepted within moments: the retry gets its answer."""
        return {"retry-after": "1"}


class IdempotencyMismatch(GatewayError):
    """The Idempotency-Key was used before with another request (app/idempotency.py)."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class PayloadTooLarge(GatewayError):
    """The body exceeds OCRVL_MAX_BODY_BYTES."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"

    def headers(self) -> dict[str, str]:
        """`Connection: close`: the body was refused part-read, and uvicorn would otherwise go
        on reading (and dropping) the rest of it to keep the connection for the next request;
        closed, the client learns at once and sends no more."""
        return {"connection": "close"}


class RateLimited(GatewayError):
    """The key is over its requests per minute or its concurrent requests (docs/limits.md)."""

    status = 429
    type = "rate_limit_error"  # as nginx's own 429 says it (nginx/templates)
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self._headers = headers

    def headers(self) -> dict[str, str]:
        """When to retry (the OpenAI SDK prefers `retry-after-ms`), and OpenAI's x-ratelimit-*."""
        return {
            "retry-after": str(max(math.ceil(self.retry_after), 1)),
            "retry-after-ms": str(max(math.ceil(self.retry_after * 1000), 1)),
            **self._headers,
        }


class BudgetExhausted(GatewayError):
    """The request would pass the key's page budget for the day or month (docs/limits.md)."""

    status = 429
    type = "insufficient_quota"  # OpenAI's own for a spent quota
    code = "insufficient_quota"

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """`Retry-After` is the budget's reset; SDKs must not retry before it (they would)."""
        return {"retry-after": str(max(math.ceil(self.retry_after), 1)), "x-should-retry": "false"}


class ClientClosed(GatewayError):
    """The client disconnected before its answer was ready; the upstream request was closed."""

    status = 499
    type = "client_closed"


class Overloaded(GatewayError):
    """Every backend is at capacity and the request cannot wait: answered at once, no backend
    call; `Retry-After` is when the queue, at the backends' drain rate, has room again."""

    status = 503
    type = "server_error"
    code = "server_overloaded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """The OpenAI SDK waits `retry-after` (up to 120 s) before its next try."""
        return {"retry-after": str(self.retry_after)}


class UpstreamError(GatewayError):
    """The backend could not produce an answer."""

    status = 502
    type = "server_error"


class BackendUnavailable(UpstreamError):
    """No backend could be reached (refused, reset, DNS) or none is healthy."""

    code = "backend_unavailable"

    def __init__(self, message: str, *, status: int = 502, retry_after: int = 5) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """A 503 says when a probe may have found a backend again; SDKs wait that long."""
        return {"retry-after": str(self.retry_after)} if self.status == 503 else {}


class LayoutUnavailable(BackendUnavailable):
    """The layout service cannot give a page's layout now (none ready, refused, a 5xx, or
    slower than OCRVL_LAYOUT_TIMEOUT): 503 with `Retry-After` (document jobs wait and retry)."""

    code = "layout_unavailable"

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message, status=503, retry_after=retry_after)


class BackendTimeout(UpstreamError):
    """The request ran past OCRVL_REQUEST_TIMEOUT."""

    status = 504
    code = "timeout"

    def headers(self) -> dict[str, str]:
        """No retry: the OpenAI SDK would run the same too-long page twice more on the GPU."""
        return {"x-should-retry": "false"}


class BackendRejected(UpstreamError):
    """The backend answered with an error status; its message is passed on."""

    def __init__(
        self, status: int, message: str, *, type_: str, param: str | None, code: str | None
    ) -> None:
        super().__init__(clip(message, MESSAGE_LIMIT), param=param, code=code)
        self.status = status
        self.type = type_


def error_body(
    message: str, type_: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(error: GatewayError) -> Response:
    """The JSON response for `error`."""
    return Response(
        orjson.dumps(error.body()),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers(),
    )


async def _gateway_error(_: Request, exc: Exception) -> Response:
    return error_response(cast(GatewayError, exc))


HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(_: Request, error: Exception) -> Response:
    exc = cast(StarletteHTTPException, error)
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = HTTP_CODES.get(exc.status_code, "invalid_request" if exc.status_code < 500 else None)
    body = error_body(str(exc.detail), type_, None, code)
    return Response(
        orjson.dumps(body),
        status_code=exc.status_code,
        media_type="application/json",
        headers=exc.headers,
    )


async def _validation_error(_: Request, error: Exception) -> Response:
    exc = cast(RequestValidationError, error)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = clip(".".join(str(part) for part in first["loc"][1:])) or None
    error = InvalidRequest(f"{param or 'request'}: {clip(str(first['msg']))}", param=param)
    return error_response(error)


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error OpenAI's body shape (each gets its type)."""
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
