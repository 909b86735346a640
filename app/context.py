"""Per-request context: the request id, the facts the access log needs, and their recording."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.metrics import Metrics

log = logging.getLogger("ocrvl.access")

# Routes worth a log line and metrics of their own; probes and scrapes would drown the log.
QUIET_ROUTES = frozenset({"/health", "/ready", "/metrics"})
CLIENT_CLOSED = 499  # nginx's convention: the client went away before the answer


@dataclass(slots=True)
class RequestContext:
    """What one request did, filled in by the layers it passes through."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    client_request_id: str | None = None
    client_retry: str | None = None  # the OpenAI SDK's x-stainless-retry-count: 0 first try
    started: float = field(default_factory=time.perf_counter)
    key_name: str | None = None
    model: str | None = None  # as the client named it
    served_model: str | None = None  # as the backend serves it (aliases rewritten)
    backend: str | None = None
    stream: bool = False
    status: int = 0
    upstream_seconds: float = 0.0
    queued_seconds: float = 0.0  # waiting in the admission queue for a backend slot
    upstream_error: str | None = None
    truncated: bool = False  # the answer hit its token limit (finish_reason "length")
    images_resized: int = 0  # chat images the gateway brought to the model's size
    # set by the per-key limits (app/quotas): the answer's x-ratelimit-* headers, and what
    # gives the request's concurrency slot back once the answer is sent or the request failed
    response_headers: Sequence[tuple[bytes, bytes]] = ()
    release: Callable[[], Awaitable[None]] | None = None

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started


def _route_label(scope: Scope) -> str:
    """The matched route's path; one label for all unmatched paths keeps metrics bounded."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestContextMiddleware:
    """Gives each request a context and an `X-Request-ID`, adds the headers the context asks
    for, runs its `release` once the last byte went out (after an error response too, or when
    the client left), then logs and measures it. (One layer for all of it: each layer costs
    every request a call and every relayed chunk a wrapped send.)"""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = RequestContext()
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                context.client_request_id = value.decode("latin-1")[:200]
            elif name == b"x-stainless-retry-count":
                context.client_retry = value.decode("latin-1")[:8]
        scope.setdefault("state", {})["context"] = context
        header = (b"x-request-id", context.request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                context.status = context.status or message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    *context.response_headers,
                    header,
                ]
            await send(message)

        quiet = scope["path"] in QUIET_ROUTES
        if not quiet:
            self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            try:
                if context.release is not None:
                    release, context.release = context.release, None
                    await release()
            finally:
                if not quiet:
                    self.metrics.in_flight.dec()
                    self._record(_route_label(scope), context)

    def _record(self, route: str, context: RequestContext) -> None:
        latency = context.elapsed()
        overhead = max(latency - context.upstream_seconds - context.queued_seconds, 0.0)
        status = context.status or 500
        self.metrics.requests.labels(route, str(status)).inc()
        self.metrics.latency.labels(route).observe(latency)
        if context.backend is not None:
            self.metrics.overhead.labels(route).observe(overhead)
        if context.upstream_error is not None:
            self.metrics.upstream_errors.labels(context.upstream_error).inc()
        if context.truncated:
            self.metrics.truncated.labels(route).inc()
        log.info(
            "request",
            extra={
                "request_id": context.request_id,
                "client_request_id": context.client_request_id,
                "client_retry": context.client_retry,
                "key": context.key_name,
                "route": route,
                "model": context.model,
                "served_model": context.served_model,
                "backend": context.backend,
                "stream": context.stream,
                "status": status,
                "latency_ms": round(latency * 1000, 3),
                "overhead_ms": round(overhead * 1000, 3),
                "queued_ms": round(context.queued_seconds * 1000, 3),
                "upstream_error": context.upstream_error,
                "truncated": context.truncated,
                "images_resized": context.images_resized,
            },
        )
