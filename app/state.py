"""The state the lifespan owns, and the dependency aliases that hand it to routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict, cast

import httpx
from fastapi import Depends, Request

from app.auth import Keyring
from app.backends import BackendPool
from app.batches.runner import BatchRunner
from app.context import RequestContext
from app.documents.layouts import LayoutService
from app.documents.workers import Preprocessor
from app.images import ChatImages
from app.jobs.runner import Runner
from app.media import MediaPolicy
from app.metrics import Metrics
from app.proxy import Relay
from app.quotas import Quotas
from app.scheduling import Scheduler
from app.settings import Settings
from app.store import Store
from app.store.idempotency import Idempotency
from app.store.results import ResultsCache
from app.usage.meter import Meter


@dataclass(frozen=True, slots=True)
class Gateway:
    """The long-lived objects: created by the lifespan, closed by it, shared by every request."""

    settings: Settings
    client: httpx.AsyncClient
    pool: BackendPool
    scheduler: Scheduler
    relay: Relay
    keyring: Keyring | None  # None: OCRVL_AUTH=off
    metrics: Metrics
    quotas: Quotas
    documents: Preprocessor  # the page preprocessing process pool (/v1/ocr)
    media: MediaPolicy  # remote image URLs: refused, or fetched under the SSRF rules
    images: ChatImages  # chat images resized in the page workers (OCRVL_RESIZE_IMAGES)
    store: Store  # jobs, their pages and documents (SQLite in OCRVL_DATA_DIR, or Redis)
    jobs: Runner  # runs the store's jobs in the background lane
    batches: BatchRunner  # runs batches (/v1/batches) there too; `.files`: /v1/files
    usage: Meter | None  # usage per key and page budgets (None: OCRVL_USAGE=off)
    layouts: LayoutService | None = None  # the layout service (None: OCRVL_LAYOUT_URL unset)
    results: ResultsCache | None = None  # the results cache's store (None: OCRVL_CACHE=off)
    idempotency: Idempotency | None = None  # Idempotency-Key records (submissions)


class State(TypedDict):
    """What the lifespan yields; uvicorn copies it into every request's `request.state`."""

    gateway: Gateway


# Async on purpose, like every dependency here: FastAPI runs sync ones in a thread pool, which
# cost a fifth of the gateway's CPU per request in bench.overhead. One bundle rather than a
# dependency per object keeps FastAPI's per-request dependency solving short.
async def _gateway(request: Request) -> Gateway:
    return cast(Gateway, request.state.gateway)


async def _context(request: Request) -> RequestContext:
    return cast(RequestContext, request.state.context)


GatewayDep = Annotated[Gateway, Depends(_gateway)]
Context = Annotated[RequestContext, Depends(_context)]
