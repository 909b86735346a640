"""Per-request context: the request id, the facts the access log needs, and their recording."""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import clip
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
    # answers the loop guard stopped (app/documents/streams.py): (label, decode tokens avoided)
    stops: list[tuple[str, int]] = field(default_factory=list)
    images_resized: int = 0  # chat images the gateway brought to the model's size
    # what the engine answered, by its own `usage` (app/usage): answers that came back (a chat
    # request: one; /v1/ocr: its pages summed here), and their tokens
    answered: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: int = 0  # pages answered from the results cache (not in `answered`: no GPU work)
    # set by the per-key limits (app/quotas): the answer's x-ratelimit-* headers, and what
    # gives the request's concurrency slot back once the answer is sent or the request failed
    response_headers: Sequence[tuple[bytes, bytes]] = ()
    release: Callable[[], Awaitable[None]] | None = None

    def on_release(self, then: Callable[[], Awaitable[None]]) -> None:
        """Run `then` when the request ends, after what already runs then (even if that fails)."""
        first = self.release
        if first is None:
            self.release = then
            return

        async def both() -> None:
            try:
                await first()
            finally:
                await then()

        self.release = both

    def part(self, suffix: str, served_model: str) -> RequestContext:
        """The context of one part of this request sent on its own (a document's page or
        block): an id under this one's, the client's ids, key and model, the served model."""
        return RequestContext(
            request_id=f"{self.request_id}-{suffix}",
            client_request_id=self.client_request_id,
            client_retry=self.client_retry,
            key_name=self.key_name,
            model=self.model,
            served_model=served_model,
        )

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started


class RouteLabels:
    """A request's route label from the gateway's own route table, the paths its routers
    declare, not from what the framework leaves in the scope (FastAPI 0.165 stopped setting
    `scope["route"]` for the plain `Route` of the chat endpoint, so every chat request counted
    as "unmatched"). One label for every path of no route keeps the metrics bounded."""

    UNMATCHED = "unmatched"

    def __init__(self, routes: Iterable[object]) -> None:
        self._exact: dict[str, str] = {}
        self._templates: list[tuple[re.Pattern[str], str]] = []
        for route in routes:
            path = getattr(route, "path", None)
            if not isinstance(path, str):
                continue
            if "{" in path:
                self._templates.append((_template(path), path))
            else:
                self._exact.setdefault(path, path)

    def __call__(self, scope: Scope) -> str:
        """The label of the route whose path template `scope`'s path fits, method aside."""
        path: str = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):  # Starlette >= 0.35 keeps the root path in `path`
            path = path[len(root) :] or "/"
        if (label := self._exact.get(path)) is not None:
            return label
        matches = (label for pattern, label in self._templates if pattern.fullmatch(path))
        return next(matches, self.UNMATCHED)


async def _release(context: RequestContext) -> None:
    """Run the context's `release` once (what the per-key limits and the usage meter hung on it)."""
    if context.release is not None:
        release, context.release = context.release, None
        await release()


def _template(path: str) -> re.Pattern[str]:
    """A route path such as `/v1/models/{model}` (or `{rest:path}`) as a regular expression."""
    pieces = re.split(r"\{([^}]*)\}", path)
    pattern = "".join(
        re.escape(piece) if i % 2 == 0 else (".+" if piece.endswith(":path") else "[^/]+")
        for i, piece in enumerate(pieces)
    )
    return re.compile(pattern)


class Activity:
    """Requests in the gateway now, and when one last ended (the allocator's trim asks it:
    a burst of bodies refused at their limit never reaches a backend, yet leaves the heap
    full)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.last_done = -math.inf  # time.monotonic()

    def busy(self, since: float) -> bool:
        """Whether a request is in the gateway now, or one ended after `since`."""
        return self.in_flight > 0 or self.last_done > since


class RequestContextMiddleware:
    """Gives each request a context and an `X-Request-ID`, adds the headers the context asks
    for, runs its `release` as the last byte goes out (or once an error was answered, or the
    client left), then logs and measures it. (One layer for all of it: each layer costs
    every request a call and every relayed chunk a wrapped send.)"""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        routes: Iterable[object],
        activity: Activity | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.activity = activity or Activity()
        self.label = RouteLabels(routes)  # built at the first request: every route is in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = RequestContext()
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                context.client_request_id = clip(value.decode("latin-1"))
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
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # released before the last byte: a client that has its whole answer finds it
                # counted (GET /v1/usage) and its concurrency slot free for the next request
                await _release(context)
            await send(message)

        quiet = scope["path"] in QUIET_ROUTES
        if not quiet:
            self.metrics.in_flight.inc()
            self.activity.in_flight += 1
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            try:
                await _release(context)  # an error answered, or the client left, mid-answer
            finally:
                if not quiet:
                    self.metrics.in_flight.dec()
                    self.activity.in_flight -= 1
                    self.activity.last_done = time.monotonic()
                    self._record(self.label(scope), context)

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
        self.metrics.count_stops(route, context.stops)
        log.info(
            "request",
            extra={
                "request_id": context.request_id,
                "client_request_id": context.client_request_id,
                "client_retry": context.client_retry,
                "key": context.key_name,
                "route": route,
                "model": None if context.model is None else clip(context.model),
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
