"""The app's lifespan: one pooled upstream client, kept alive below vLLM's expiry, closed at end."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Request

from app.main import create_app, upstream_client, upstream_transport
from tests.conftest import settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client


@pytest.mark.anyio
async def test_upstream_client_is_pooled_below_vllms_keepalive() -> None:
    """Connections idle for 4 s are dropped before vLLM (5 s) closes them under a request."""
    settings = settings_for("http://127.0.0.1:1", max_connections=300)
    async with upstream_client(settings, upstream_transport(settings)) as client:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert pool._keepalive_expiry == 4.0
        assert pool._max_connections == 300
        assert client.timeout.connect == settings.connect_timeout
        assert client.timeout.read is None  # the request deadline bounds reads instead


@pytest.mark.anyio
async def test_lifespan_owns_and_closes_the_client(fake: FakeVLLM) -> None:
    """Every request shares the lifespan's client; shutdown closes it."""
    app = create_app(settings_for(fake.url))
    seen: list[httpx.AsyncClient] = []

    @app.get("/__client")
    async def client_of(request: Request) -> dict[str, str]:  # a probe route for this test
        seen.append(request.state.gateway.client)
        return {}

    async with lifespan_client(app) as client:
        await client.get("/__client")
        await client.get("/__client")
    assert seen[0] is seen[1]
    assert seen[0].is_closed
