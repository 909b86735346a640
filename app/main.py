"""The ASGI app: `create_app(settings)` wires routes, errors and a lifespan that owns all state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI

from app import __version__, logs
from app.allocator import trim_when_idle
from app.auth import Keyring
from app.backends import BackendPool
from app.context import RequestContextMiddleware
from app.discovery import Discovery
from app.documents.workers import Preprocessor
from app.errors import install_handlers
from app.images import ChatImages
from app.media import MediaPolicy
from app.metrics import Metrics
from app.proxy import Relay
from app.quotas import Quotas
from app.routes import chat, health, models, ocr
from app.scheduling import Scheduler
from app.settings import Settings
from app.state import Gateway, State
from app.upstream import Upstream

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


def upstream_transport(settings: Settings) -> httpx.AsyncHTTPTransport:
    """Every backend connection the gateway holds, kept alive below vLLM's 5 s expiry."""
    return httpx.AsyncHTTPTransport(
        limits=httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
            keepalive_expiry=settings.keepalive_expiry,
        ),
        trust_env=False,  # a host's HTTP_PROXY must not capture backend traffic
    )


def create_app(settings: Settings) -> FastAPI:
    """Build the gateway for `settings`."""
    logs.configure(settings.log_level)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[State]:
        keyring = None
        if settings.auth == "on":
            keys = [key.get_secret_value() for key in settings.api_keys]
            keyring = Keyring(keys, settings.api_keys_file)
        else:
            log.warning("OCRVL_AUTH=off: every request is served without an API key")
        quotas = Quotas.from_settings(settings, keyring, metrics)
        await quotas.start()
        backend_key = (
            settings.backend_api_key.get_secret_value() if settings.backend_api_key else None
        )
        auth_header = {"authorization": f"Bearer {backend_key}"} if backend_key else {}
        transport = upstream_transport(settings)
        async with upstream_client(settings, transport) as client:
            members = None
            if any(spec.discover for spec in settings.backends):
                discovery = Discovery(
                    settings.backends, settings.dns_server, settings.connect_timeout
                )
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
            scheduler = Scheduler(
                pool,
                metrics,
                enabled=settings.admission == "on",
                queue_size=settings.queue_size,
                queue_timeout=settings.queue_timeout,
            )
            collector = metrics.watch_backends(scheduler.readings)
            watchers = [
                asyncio.create_task(pool.watch()),
                asyncio.create_task(trim_when_idle(scheduler.busy)),
                asyncio.create_task(
                    scheduler.watch(
                        client, auth_header, settings.metrics_interval, settings.connect_timeout
                    )
                ),
            ]
            upstream = Upstream(
                settings.max_connections, settings.keepalive_expiry, settings.connect_timeout
            )
            relay = Relay(
                upstream,
                pool,
                scheduler,
                backend_key=backend_key,
                request_timeout=settings.request_timeout,
                max_pixels=settings.max_pixels,
            )
            documents = Preprocessor(settings.preprocess_workers)  # workers start on first use
            media = MediaPolicy(settings)
            try:
                yield State(
                    gateway=Gateway(
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
                        images=ChatImages(settings, documents),
                    )
                )
            finally:
                upstream.close()
                await media.aclose()
                await asyncio.to_thread(documents.close)
                await quotas.close()
                metrics.registry.unregister(collector)
                for watcher in watchers:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher

    app = FastAPI(
        title="PaddleOCR-VL gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_handlers(app)
    for router in (chat.router, ocr.router, models.router, health.router):
        app.include_router(router)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)  # also the quotas' release
    return app
