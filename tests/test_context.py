"""Request ids, the JSON access line and the Prometheus metrics."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from app.context import RequestContextMiddleware
from app.logs import JSONFormatter
from app.main import create_app
from app.metrics import Metrics
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
BODY = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}]}


async def test_every_response_carries_a_fresh_request_id(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """Each response, errors included, has its own gateway-made X-Request-ID."""
    ok = await gateway_client.post("/v1/chat/completions", json=BODY)
    bad = await gateway_client.post("/v1/chat/completions", content=b"{")
    health = await gateway_client.get("/health")
    ids = [r.headers["x-request-id"] for r in (ok, bad, health)]
    assert len(set(ids)) == 3
    assert all(len(i) == 32 for i in ids)


async def test_client_request_id_is_logged_not_forwarded(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's X-Request-ID is logged beside the gateway's; vLLM gets the gateway's."""
    logging.getLogger("ocrvl").propagate = True
    with caplog.at_level(logging.INFO, logger="ocrvl.access"):
        response = await gateway_client.post(
            "/v1/chat/completions",
            json=BODY,
            headers={"x-request-id": "client-abc", "x-stainless-retry-count": "1"},
        )
    ours = response.headers["x-request-id"]
    assert ours != "client-abc"
    assert fake.headers[-1]["x-request-id"] == ours
    line = json.loads(JSONFormatter().format(caplog.records[-1]))
    assert line["request_id"] == ours
    assert line["client_request_id"] == "client-abc"
    assert line["key"] == "env#1"
    assert line["model"] == "PaddleOCR-VL"
    assert line["served_model"] == SERVED  # the alias as rewritten
    assert line["client_retry"] == "1"  # an SDK retry is recognisable as one
    assert line["truncated"] is False
    assert line["backend"] == fake.url
    assert line["status"] == 200
    assert line["latency_ms"] >= line["overhead_ms"] >= 0


async def test_metrics_count_requests_latency_overhead_and_upstream_errors(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """/metrics (no key) has requests by route and status, histograms, in-flight, error kinds."""
    await gateway_client.post("/v1/chat/completions", json=BODY)
    fake.mode, fake.status = "status", 500
    await gateway_client.post("/v1/chat/completions", json=BODY)
    await gateway_client.get("/nowhere/1")
    await gateway_client.get("/nowhere/2")
    text = (await gateway_client.get("/metrics", headers={"authorization": ""})).text
    assert 'ocrvl_requests_total{route="/v1/chat/completions",status="200"} 1.0' in text
    assert 'ocrvl_requests_total{route="/v1/chat/completions",status="500"} 1.0' in text
    assert 'ocrvl_requests_total{route="unmatched",status="404"} 2.0' in text
    assert 'ocrvl_request_duration_seconds_count{route="/v1/chat/completions"} 2.0' in text
    assert 'ocrvl_gateway_overhead_seconds_count{route="/v1/chat/completions"} 2.0' in text
    assert 'ocrvl_upstream_errors_total{kind="status_5xx"} 1.0' in text
    assert "ocrvl_requests_in_flight 0.0" in text
    # no model or key labels on the request families (bounded cardinality); only the usage
    # counters carry them, by key name and served model, both from the gateway's own lists
    usage = [line for line in text.splitlines() if line.startswith("ocrvl_usage_")]
    others = [line for line in text.splitlines() if not line.startswith("ocrvl_usage_")]
    assert not [line for line in others if SERVED in line]
    assert all('key="env#1"' in line for line in usage if "{" in line)
    assert "sk-" not in text  # a key itself never


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_release_runs_before_the_last_byte_reaches_the_client(stream: bool) -> None:
    """What hangs on a request's end (its usage counted, its concurrency slot given back) has
    run when the client gets the answer's last byte: a client that reads /v1/usage, or sends
    its next request, right after finds it done (CI once read usage before it was counted)."""
    seen: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        async def released() -> None:
            seen.append("released")

        scope["state"]["context"].on_release(released)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if stream:
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b", "more_body": False})
        seen.append("app returned")

    async def server_send(message) -> None:  # type: ignore[no-untyped-def]
        if message["type"] == "http.response.body":
            seen.append(f"body more={bool(message.get('more_body'))}")

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.disconnect"}

    middleware = RequestContextMiddleware(app, Metrics(), routes=[])
    scope = {"type": "http", "path": "/v1/ocr", "headers": []}
    await middleware(scope, receive, server_send)
    last = ["released", "body more=False", "app returned"]
    assert seen == (["body more=True"] if stream else []) + last  # released once, first


async def test_release_still_runs_when_the_client_leaves_mid_answer() -> None:
    """No last byte (the client went away): the request's end still releases, once."""
    released: list[int] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        async def release() -> None:
            released.append(1)

        scope["state"]["context"].on_release(release)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise OSError("the client went away")

    async def server_send(message) -> None:  # type: ignore[no-untyped-def]
        return None

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.disconnect"}

    middleware = RequestContextMiddleware(app, Metrics(), routes=[])
    with pytest.raises(OSError, match="went away"):
        await middleware({"type": "http", "path": "/v1/ocr", "headers": []}, receive, server_send)
    assert released == [1]


async def test_a_request_refused_at_the_gateway_counts_as_activity_for_the_trim(
    fake: FakeVLLM,
) -> None:
    """The allocator's idle trim asks the middleware's Activity: a body refused at its limit
    (it never reaches a backend slot) makes the gateway busy while in flight and "busy since"
    after, so the heap it filled is handed back once idle; /health does not count."""
    app = create_app(settings_for(fake.url, max_body_bytes=1024))
    activity = next(m.kwargs["activity"] for m in app.user_middleware if m.kwargs.get("activity"))
    async with lifespan_client(app, headers={"authorization": f"Bearer {CLIENT_KEY}"}) as client:
        before = time.monotonic()
        await client.get("/health")
        assert not activity.busy(before)
        refused = await client.post("/v1/chat/completions", content=b"x" * 4096)
    assert refused.status_code == 413
    assert activity.busy(before)
    assert activity.in_flight == 0
    assert not activity.busy(time.monotonic())
