"""The state the lifespan owns, and the dependency aliases that hand it to routes."""

from __future__ import annotations

from typing import Annotated, TypedDict, cast

import httpx
from fastapi import Depends, Request

from app.auth import Keyring
from app.backends import BackendPool
from app.context import RequestContext
from app.metrics import Metrics
from app.proxy import Relay
from app.settings import Settings


class State(TypedDict):
    """Long-lived objects, created and closed by the lifespan, copied into every request."""

    settings: Settings
    client: httpx.AsyncClient
    pool: BackendPool
    relay: Relay
    keyring: Keyring | None
    metrics: Metrics


async def _pool(request: Request) -> BackendPool:
    return cast(BackendPool, request.state.pool)


async def _relay(request: Request) -> Relay:
    return cast(Relay, request.state.relay)


async def _settings(request: Request) -> Settings:
    return cast(Settings, request.state.settings)


async def _metrics(request: Request) -> Metrics:
    return cast(Metrics, request.state.metrics)


async def _context(request: Request) -> RequestContext:
    return cast(RequestContext, request.state.context)


Pool = Annotated[BackendPool, Depends(_pool)]
RelayDep = Annotated[Relay, Depends(_relay)]
SettingsDep = Annotated[Settings, Depends(_settings)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
Context = Annotated[RequestContext, Depends(_context)]
