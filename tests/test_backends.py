"""Backend health: probes, readiness, liveness without backend calls, least-busy choice."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app import backends
from app.backends import Backend, BackendPool
from app.main import create_app
from app.metrics import Metrics
from app.scheduling import Scheduler
from app.settings import BackendSpec
from tests.conftest import settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import free_port, lifespan_client

pytestmark = pytest.mark.anyio


async def test_health_needs_no_key_and_no_backend() -> None:
    """/health answers 200 with no key even when no backend exists, in our shape and PaddleX's
    (`{"status": "ok", "errorCode": 0, "errorMsg": "Healthy", "logId"}`)."""
    app = create_app(settings_for(f"http://127.0.0.1:{free_port()}"))
    async with lifespan_client(app) as client:
        response = await client.get("/health")
    body = response.json()
    assert response.status_code == 200
    assert body == {"status": "ok", "errorCode": 0, "errorMsg": "Healthy", "logId": body["logId"]}
    assert response.headers["x-request-id"].replace("-", "") in body["logId"].replace("-", "")


async def ready_once_it_is(client: httpx.AsyncClient, status: int) -> httpx.Response:
    """/ready's answer once its status is `status` (the probes run every 0.2 s); a failed
    assertion, with the last answer, if it is not within 15 s."""
    deadline = time.monotonic() + 15
    while (ready := await client.get("/ready")).status_code != status:
        assert time.monotonic() < deadline, f"/ready not {status} within 15 s: {ready.text}"
        await asyncio.sleep(0.05)
    return ready


async def test_ready_follows_backend_health(fake: FakeVLLM) -> None:
    """/ready is 200 while a backend answers /health, 503 (naming why) once none does."""
    async with lifespan_client(create_app(settings_for(fake.url))) as client:
        up = await client.get("/ready")
        fake.mode = "unhealthy"
        down = await ready_once_it_is(client, 503)
        fake.mode = "ok"
        again = await ready_once_it_is(client, 200)
    assert up.status_code == 200
    assert up.json()["backends"] == [fake.url]
    assert down.status_code == 503
    assert "/health answered 503" in down.json()["error"]["message"]
    assert again.status_code == 200


async def test_wrong_backend_key_shows_in_readiness(fake: FakeVLLM) -> None:
    """A backend whose /v1/models refuses the gateway's key is not ready, with a hint."""

    async def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(401, json={"error": "Unauthorized"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        pool = BackendPool([BackendSpec("http://backend")], client, {}, timeout=1)
        await pool.probe_all()
    assert pool.healthy() == []
    assert "check OCRVL_BACKEND_API_KEY" in pool.problems()


def engine(state: dict[str, str]) -> httpx.MockTransport:
    """A stand-in engine whose `state` is "serving" (vLLM while running, and while it drains:
    /health 200 and its model list all along) or "gone" (the process exited)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if state["now"] == "gone":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, json={"object": "list", "data": [{"id": SERVED}]})

    return httpx.MockTransport(answer)


async def test_a_stopping_engine_stays_out_until_it_has_gone() -> None:
    """An engine that refused a page as stopping stays out of rotation while its probes pass
    (vLLM drains answering /health 200); once a probe finds it gone, the next one that finds
    it serving (restarted) brings it back."""
    state = {"now": "serving"}
    async with httpx.AsyncClient(transport=engine(state)) as client:
        pool = BackendPool([BackendSpec("http://engine")], client, {}, timeout=1)
        await pool.probe_all()
        assert [b.url for b in pool.healthy()] == ["http://engine"]
        pool.backends[0].mark_stopping("cannot schedule new futures after shutdown")
        await pool.probe_all()
        draining = pool.problems()
        state["now"] = "gone"
        await pool.probe_all()
        gone = pool.problems()
        state["now"] = "serving"
        await pool.probe_all()
    assert "stopping: cannot schedule new futures" in draining
    assert "stopping" not in gone
    assert [b.url for b in pool.healthy()] == ["http://engine"]


async def test_a_stopping_engine_that_never_goes_returns_after_the_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal that read as stopping but whose engine stays (it answers on) keeps it out
    STOP_HOLD_S, not for good: the clock past the hold, the next probe brings it back."""
    now = [1000.0]
    monkeypatch.setattr(backends, "monotonic", lambda: now[0])
    async with httpx.AsyncClient(transport=engine({"now": "serving"})) as client:
        pool = BackendPool([BackendSpec("http://engine")], client, {}, timeout=1)
        pool.backends[0].mark_stopping("shutting down")
        now[0] += backends.STOP_HOLD_S - 1
        await pool.probe_all()
        held = pool.healthy()
        now[0] += 2
        await pool.probe_all()
    assert held == []
    assert [b.url for b in pool.healthy()] == ["http://engine"]


async def test_least_busy_backend_takes_the_request() -> None:
    """Among healthy backends serving the model, the one with fewest requests in flight wins."""
    pool = BackendPool([], httpx.AsyncClient(), {}, timeout=1)
    busy, idle, sick = (Backend(url) for url in ("http://busy", "http://idle", "http://sick"))
    for backend, in_flight in ((busy, 3), (idle, 1), (sick, 0)):
        backend.healthy, backend.in_flight = backend is not sick, in_flight
        backend.models = {SERVED: {"id": SERVED}}
    pool.backends = [busy, idle, sick]
    scheduler = Scheduler(pool, Metrics(), enabled=False, queue_size=0, queue_timeout=1)
    for _ in range(3):
        lease = await scheduler.acquire(SERVED, "k")
        assert lease is not None
        assert lease.backend.url == "http://idle"
        lease.release()
    assert await scheduler.acquire("other-model", "k") is None
