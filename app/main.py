"""The ASGI app: `create_app(settings)` wires routes, errors and a lifespan that owns all state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Coroutine
from contextlib import AsyncExitStack
from typing import Any

import httpx
from fastapi import FastAPI

from app import __version__, logs, openapi, scratch
from app.allocator import trim_when_idle
from app.auth import Keyring
from app.backends import BackendPool
from app.batches.requests import Chats
from app.batches.runner import open_batches
from app.closing import Closing, cancelled
from app.context import Activity, RequestContextMiddleware
from app.discovery import Discovery
from app.documents.cache import sweeping
from app.documents.layouts import open_layouts
from app.documents.workers import Preprocessor
from app.errors import install_handlers
from app.images import ChatImages
from app.jobs.runner import open_jobs
from app.media import MediaPolicy
from app.metrics import Metrics
from app.proxy import Relay
from app.quotas import Quotas
from app.routes import batches, chat, files, health, jobs, layout_parsing, models, ocr, ui, usage
from app.scheduling import Scheduler
from app.settings import Settings
from app.state import Gateway, State
from app.stopping import Stop
from app.store import open_idempotency, open_results
from app.upstream import Upstream, trust
from app.usage.meter import metering

log = logging.getLogger("ocrvl.main")


def upstream_client(settings: Settings, transport: httpx.AsyncHTTPTransport) -> httpx.AsyncClient:
    """The one HTTP client to every backend, over `transport`, its connection pool."""
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(
            connect=settings.connect_timeout,
            read=None,  # the request deadline bounds reads; a page may take minutes
            write=settings.request_timeout,
            pool=settings.request_timeout,
        ),
        trust_env=False,
    )


def upstream_transport(
    settings: Settings, tls: ssl.SSLContext | None = None
) -> httpx.AsyncHTTPTransport:
    """Every backend connection the gateway holds, kept alive below vLLM's 5 s expiry; an
    https:// backend verified with `tls` (else httpx's own trust, certifi's)."""
    return httpx.AsyncHTTPTransport(
        verify=tls or True,
        limits=httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
            keepalive_expiry=settings.keepalive_expiry,
        ),
        trust_env=False,  # a host's HTTP_PROXY must not capture backend traffic
    )


def keyring_for(settings: Settings) -> Keyring | None:
    """The API keys requests must carry, or None (with a warning) when OCRVL_AUTH=off."""
    if settings.auth == "on":
        keys = [key.get_secret_value() for key in settings.api_keys]
        return Keyring(keys, settings.api_keys_file)
    log.warning("OCRVL_AUTH=off: every request is served without an API key")
    return None


async def backend_pool(
    settings: Settings, client: httpx.AsyncClient, auth_header: dict[str, str]
) -> BackendPool:
    """The engines behind the gateway (expanded by DNS where asked), probed once."""
    members = None
    if any(spec.discover for spec in settings.backends):
        discovery = Discovery(settings.backends, settings.dns_server, settings.connect_timeout)
        members = discovery.members
    pool = BackendPool(
        settings.backends,
        client,
        auth_header,
        timeout=settings.connect_timeout,
        interval=settings.health_interval,
        members=members,
    )
    await pool.probe_all()
    if not pool.healthy():
        log.warning("no backend is healthy yet: %s", pool.problems() or "none configured")
    return pool


def watched_scheduler(
    settings: Settings, metrics: Metrics, pool: BackendPool, stack: AsyncExitStack
) -> Scheduler:
    """The admission scheduler over `pool`, its engines' readings exported until `stack` closes."""
    scheduler = Scheduler(
        pool,
        metrics,
        enabled=settings.admission == "on",
        queue_size=settings.queue_size,
        queue_timeout=settings.queue_timeout,
    )
    stack.callback(metrics.registry.unregister, metrics.watch_backends(scheduler.readings))
    return scheduler


def background(stack: AsyncExitStack, work: Coroutine[Any, Any, None]) -> None:
    """Run `work` as a task until `stack` closes, then cancel it and wait for it."""
    task = asyncio.create_task(work, name=getattr(work, "__qualname__", None))
    stack.push_async_callback(cancelled, task)


def relay_for(
    settings: Settings,
    pool: BackendPool,
    scheduler: Scheduler,
    backend_key: str | None,
    stack: AsyncExitStack,
    *,
    metering: bool,
    tls: ssl.SSLContext | None = None,
) -> Relay:
    """The relay to the backends, over its own HTTP/1.1 connections closed by `stack` (an
    https:// backend verified with `tls`, else httpx's own trust)."""
    upstream = Upstream(
        settings.max_connections, settings.keepalive_expiry, settings.connect_timeout, tls=tls
    )
    stack.callback(upstream.close)
    return Relay(
        upstream,
        pool,
        scheduler,
        backend_key=backend_key,
        request_timeout=settings.request_timeout,
        max_pixels=settings.max_pixels,
        metering=metering,
        stream_interval=settings.engine_stream_interval,
    )


async def open_gateway(
    settings: Settings,
    metrics: Metrics,
    stack: AsyncExitStack,
    stop: Stop | None = None,
    activity: Activity | None = None,
) -> Gateway:
    """Open every long-lived object, each closed by `stack` in the reverse order of opening
    (`stop`: the server's stop as it begins, before requests drain; `activity`: the requests in
    the gateway, RequestContextMiddleware's, for the trim)."""
    await asyncio.to_thread(scratch.sweep)  # what gateways killed outright left behind
    keyring = keyring_for(settings)
    quotas = Quotas.from_settings(settings, keyring, metrics)
    await quotas.start()
    stack.push_async_callback(quotas.close)
    meter = await stack.enter_async_context(metering(settings, keyring, metrics))
    backend_key = settings.backend_api_key.get_secret_value() if settings.backend_api_key else None
    auth_header = {"authorization": f"Bearer {backend_key}"} if backend_key else {}
    tls = trust(settings.upstream_ca_file)  # one context for the probes and the relay
    transport = upstream_transport(settings, tls)
    client = await stack.enter_async_context(upstream_client(settings, transport))
    pool = await backend_pool(settings, client, auth_header)
    scheduler = watched_scheduler(settings, metrics, pool, stack)
    background(stack, pool.watch())
    seen = activity or Activity()  # a refused body never reaches the scheduler
    background(stack, trim_when_idle(lambda since: scheduler.busy(since) or seen.busy(since)))
    every, timeout = settings.metrics_interval, settings.connect_timeout
    background(stack, scheduler.watch(client, auth_header, every, timeout))
    relay = relay_for(
        settings, pool, scheduler, backend_key, stack, metering=meter is not None, tls=tls
    )
    documents = Preprocessor(  # workers start on first use
        settings.preprocess_workers, settings.preprocess_held_bytes
    )
    stack.push_async_callback(asyncio.to_thread, documents.close)
    media = MediaPolicy(settings)
    stack.push_async_callback(media.aclose)
    layouts = await open_layouts(settings, stack, metrics.layout_stages)
    results = await open_results(settings)
    if results is not None:
        log.info("the results cache is kept in %s", results.where)
        stack.push_async_callback(results.close)
        background(stack, sweeping(results, metrics, settings.cache_sweep_interval))
    idempotency = open_idempotency(settings)
    await idempotency.open()
    stack.push_async_callback(idempotency.close)
    runner = await open_jobs(
        settings, metrics=metrics, scheduler=scheduler, relay=relay, documents=documents,
        stack=stack, meter=meter, layouts=layouts, results=results, stop=stop,
    )  # fmt: skip
    images = ChatImages(settings, documents)
    chats = Chats(settings, pool, relay, media, images)
    batches = await open_batches(
        settings, chats=chats, jobs=runner, documents=documents, stack=stack, meter=meter
    )
    return Gateway(
        settings=settings,
        client=client,
        pool=pool,
        scheduler=scheduler,
        relay=relay,
        keyring=keyring,
        metrics=metrics,
        quotas=quotas,
        documents=documents,
        media=media,
        images=images,
        store=runner.store,
        jobs=runner,
        batches=batches,
        usage=meter,
        layouts=layouts,
        results=results,
        idempotency=idempotency,
    )


def create_app(settings: Settings, stop: Stop | None = None) -> FastAPI:
    """Build the gateway for `settings` (`stop`: set by the server as it begins to stop)."""
    logs.configure(settings.log_level)
    metrics = Metrics()
    activity = Activity()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[State]:
        async with Closing(settings.close_timeout) as stack:  # each step bounded and logged
            yield State(gateway=await open_gateway(settings, metrics, stack, stop, activity))

    app = FastAPI(
        title="PaddleOCR-VL gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_handlers(app)
    openapi.install(app)  # every route's body and answers in /openapi.json
    routers = [chat.router, ocr.router, jobs.router, files.router, batches.router, usage.router]
    routers += [layout_parsing.router, models.router, health.router]  # PaddleX's serving API
    routers += ui.routers(settings)  # the /ui page, unless OCRVL_UI=off
    for router in routers:
        app.include_router(router)
    # also the quotas' release; the route labels come from the routes these routers declare
    # (FastAPI 0.165 nests included routers in app.routes): app/context.py
    routes = [*app.routes, *(route for router in routers for route in router.routes)]
    app.add_middleware(RequestContextMiddleware, metrics=metrics, routes=routes, activity=activity)
    return app
