"""Admission through the gateway's HTTP surface, in front of FakeVLLM holding each answer
(its `gate`: a backend busy with a long page until the test has seen what it waits for, the
fault a real engine cannot hold on demand)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.prometheus import metric
from tests.support.servers import ThreadedServer, lifespan_client
from tests.support.waits import until_metric

pytestmark = pytest.mark.anyio
BODY = {"model": SERVED, "messages": [{"role": "user", "content": "OCR:"}]}
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.mark.parametrize("stream", [False, True])
async def test_overload_is_a_fast_openai_503_with_retry_after(fake: FakeVLLM, stream: bool) -> None:
    """Capacity 1, no queue: the second request is shed at once (while the first one's answer
    is still held), before any backend call."""
    fake.gate = threading.Event()
    settings = settings_for(f"{fake.url};capacity=1", queue_size=0)
    async with lifespan_client(create_app(settings), headers=AUTH) as client:
        first = asyncio.create_task(
            client.post("/v1/chat/completions", json={**BODY, "stream": stream})
        )
        assert await asyncio.to_thread(fake.chat_started.wait, 30)
        shed = await client.post("/v1/chat/completions", json={**BODY, "stream": stream})
        assert not first.done()  # not queued behind it: answered while the slot is still held
        fake.gate.set()
        assert (await first).status_code == 200
        metrics = (await client.get("/metrics")).text
    assert shed.status_code == 503
    assert int(shed.headers["retry-after"]) >= 1
    error = shed.json()["error"]
    assert error["code"] == "server_overloaded"
    assert error["type"] == "server_error"
    assert set(error) == {"message", "type", "param", "code"}
    assert "OCRVL_QUEUE_SIZE" in error["message"]
    assert len(fake.bodies) == 1  # the shed request never reached the backend
    assert metric(metrics, "ocrvl_shed_total", reason="queue_full") == 1
    assert metric(metrics, "ocrvl_backend_capacity", backend=fake.url) == 1


async def test_the_sequences_the_gateway_keeps_on_a_backend_are_exported(fake: FakeVLLM) -> None:
    """An engine that says no max-num-seqs (vLLM 0.32): the gateway keeps at most the 256 every
    profile stays within on it, or its capacity where that is more, and /metrics says which."""
    for given, sequences in (("", 256), (";capacity=300", 300)):
        settings = settings_for(fake.url + given)
        async with lifespan_client(create_app(settings), headers=AUTH) as client:
            metrics = (await client.get("/metrics")).text
        assert metric(metrics, "ocrvl_backend_sequences", backend=fake.url) == sequences


async def test_a_stream_holds_its_slot_until_it_ends(fake: FakeVLLM) -> None:
    """A slow stream keeps capacity 1 taken; once its client closes it, the slot is free."""
    fake.mode = "slow_stream"
    settings = settings_for(f"{fake.url};capacity=1", queue_size=0)
    with ThreadedServer(create_app(settings)) as gateway:
        async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=10) as client:
            async with client.stream(
                "POST", "/v1/chat/completions", json={**BODY, "stream": True}
            ) as streaming:
                chunks = streaming.aiter_raw()  # held: a dropped iterator closes the stream
                assert await anext(chunks)
                during = await client.post("/v1/chat/completions", json=BODY)
            fake.mode = "ok"
            assert await asyncio.to_thread(fake.disconnected.wait, 30)
            await until_metric(client, "ocrvl_backend_in_flight", 0, backend=fake.url)
            after = await client.post("/v1/chat/completions", json=BODY)
    assert during.status_code == 503
    assert after.status_code == 200


async def test_queued_requests_are_served_in_turn(fake: FakeVLLM) -> None:
    """Capacity 1 and six requests at once: all six get 200, one at a time upstream."""
    fake.delay = 0.1
    settings = settings_for(f"{fake.url};capacity=1")
    async with lifespan_client(create_app(settings), headers=AUTH) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=BODY) for _ in range(6))
        )
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in responses] == [200] * 6
    assert metric(metrics, "ocrvl_queue_wait_seconds_count") >= 5
    assert metric(metrics, "ocrvl_queue_depth") == 0


async def test_a_client_leaving_the_queue_frees_its_place(fake: FakeVLLM) -> None:
    """Three requests on capacity 1: the queued one whose client disconnects leaves the queue
    at once (its page never reaches the backend); the one behind it is served."""
    fake.gate = threading.Event()  # the holder's answer waits until the queue is seen
    settings = settings_for(f"{fake.url};capacity=1")
    with ThreadedServer(create_app(settings)) as gateway:
        async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH, timeout=60) as client:
            holder = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
            assert await asyncio.to_thread(fake.chat_started.wait, 30)
            leaving = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
            await until_metric(client, "ocrvl_queue_depth", 1)
            behind = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
            await until_metric(client, "ocrvl_queue_depth", 2)
            leaving.cancel()  # httpx closes the connection
            await until_metric(client, "ocrvl_queue_depth", 1)
            fake.gate.set()
            assert (await holder).status_code == 200
            assert (await behind).status_code == 200
    assert len(fake.bodies) == 2  # the holder's page and the one behind: not the gone one
