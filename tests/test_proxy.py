"""The relay against FakeVLLM: pass-through, backend errors, timeouts, failover, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest

from app.main import create_app
from tests.conftest import BACKEND_KEY, CLIENT_KEY, settings_for
from tests.support.fake_backend import SERVED, STREAM_CHUNKS, FakeVLLM, completion
from tests.support.servers import ThreadedServer, free_port, lifespan_client

pytestmark = pytest.mark.anyio
BODY = {"model": SERVED, "messages": [{"role": "user", "content": "OCR:"}]}
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


async def test_non_streaming_answer_is_the_backends_json(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A non-streaming answer is vLLM's JSON, byte for byte."""
    response = await gateway_client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200
    assert response.content == orjson.dumps(completion(SERVED))


async def test_streaming_passes_sse_bytes_through_unbuffered(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A stream arrives as the backend's exact SSE bytes, marked for proxies not to buffer."""
    async with gateway_client.stream(
        "POST", "/v1/chat/completions", json={**BODY, "stream": True}
    ) as response:
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.status_code == 200
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["content-type"].startswith("text/event-stream")
    assert received == b"".join(STREAM_CHUNKS)


async def test_bare_chat_completions_path_is_an_alias(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """`POST /chat/completions` (seed recipes, hey) relays like the /v1 path."""
    response = await gateway_client.post("/chat/completions", json=BODY)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello page"


async def test_backend_gets_its_own_key_never_the_clients(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """Upstream sees OCRVL_BACKEND_API_KEY; the client's key is not forwarded."""
    await gateway_client.post("/v1/chat/completions", json=BODY)
    upstream_headers = fake.headers[-1]
    assert upstream_headers["authorization"] == f"Bearer {BACKEND_KEY}"
    assert CLIENT_KEY not in str(upstream_headers)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            b'{"error":{"message":"max_tokens is too large","type":"BadRequestError",'
            b'"param":"max_tokens","code":400}}',
            {"message": "max_tokens is too large", "type": "invalid_request_error",
             "param": "max_tokens", "code": "invalid_request"},
        ),
        (
            400,
            b'{"object":"error","message":"old shape","type":"BadRequestError","param":null,'
            b'"code":400}',
            {"message": "old shape", "type": "invalid_request_error", "param": None,
             "code": "invalid_request"},
        ),
        (  # vLLM's own words for a 10000x28 page (0.32): the processor's inputs, PIL's repr
            400,
            b'{"error":{"message":"Failed to apply PaddleOCRVLProcessor on data={\'text\': '
            b"['<|IMAGE_START|>OCR:'], 'images': [<PIL.Image.Image image mode=RGB "
            b"size=10000x28>]} with kwargs={'return_tensors': 'pt'}\",\"type\":"
            b'"BadRequestError","param":null,"code":400}}',
            {"message": "Failed to apply PaddleOCRVLProcessor: the engine's image processor "
             "could not take an image of the request", "type": "invalid_request_error",
             "param": "messages", "code": "invalid_image"},
        ),
        (
            400,
            b'{"error":{"message":"cannot identify image file <_io.BytesIO object at '
            b'0x7f01ab>","type":"BadRequestError","param":null,"code":400}}',
            {"message": "cannot identify image file", "type": "invalid_request_error",
             "param": "messages", "code": "invalid_image"},
        ),
        (
            500,
            b"Internal Server Error",
            {"message": "the backend answered 500: Internal Server Error", "type": "server_error",
             "param": None, "code": "backend_error"},
        ),
        (
            503,
            b"",
            {"message": "the backend answered 503", "type": "server_error", "param": None,
             "code": "backend_error"},
        ),
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
async def test_backend_errors_pass_on_in_openai_shape(
    gateway_client: httpx.AsyncClient,
    fake: FakeVLLM,
    status: int,
    body: bytes,
    expected: dict[str, object],
    stream: bool,
) -> None:
    """A backend 4xx/5xx keeps its status and message, rewritten into the gateway's shape: its
    own type and code (never vLLM's class name and status), no Python object reprs."""
    fake.mode, fake.status, fake.error_body = "status", status, body
    response = await gateway_client.post("/v1/chat/completions", json={**BODY, "stream": stream})
    assert response.status_code == status
    assert response.json() == {"error": expected}


async def test_hung_backend_times_out_with_504_and_upstream_closed(fake: FakeVLLM) -> None:
    """A backend that never answers: 504 at OCRVL_REQUEST_TIMEOUT, and the upstream is closed."""
    fake.mode = "hang"
    app = create_app(settings_for(fake.url, request_timeout=0.5))
    async with lifespan_client(app, headers=AUTH) as client:
        started = asyncio.get_running_loop().time()
        response = await client.post("/v1/chat/completions", json=BODY)
        elapsed = asyncio.get_running_loop().time() - started
    assert response.status_code == 504
    assert response.headers["x-should-retry"] == "false"  # the SDK must not rerun the page
    assert response.json()["error"]["code"] == "timeout"
    assert "OCRVL_REQUEST_TIMEOUT" in response.json()["error"]["message"]
    assert elapsed < 3
    assert await asyncio.to_thread(fake.disconnected.wait, 10), "upstream request left open"


async def test_endless_stream_is_cut_at_the_deadline_with_an_error_event(fake: FakeVLLM) -> None:
    """A stream past OCRVL_REQUEST_TIMEOUT ends with an SSE error event; upstream is closed."""
    fake.mode = "slow_stream"
    app = create_app(settings_for(fake.url, request_timeout=0.6))
    async with lifespan_client(app, headers=AUTH) as client:
        response = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
    events = [line for line in response.text.split("\n\n") if line]
    assert response.status_code == 200
    assert len(events) > 2, "the stream should have flowed until the deadline"
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == "timeout"
    assert await asyncio.to_thread(fake.disconnected.wait, 10), "upstream stream left open"


async def test_stream_broken_by_the_backend_ends_with_an_error_event(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A backend dying mid-stream: the chunks so far, then an error event, then the end."""
    fake.mode = "broken_stream"
    response = await gateway_client.post("/v1/chat/completions", json={**BODY, "stream": True})
    events = [line for line in response.text.split("\n\n") if line]
    assert events[0].startswith('data: {"id":"c1"')
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert "stream broke" in last["error"]["message"]


async def test_refused_backend_is_a_502_naming_the_cause() -> None:
    """Nothing listening upstream: 502 (reached) or 503 (known down), the cause named."""
    url = f"http://127.0.0.1:{free_port()}"
    app = create_app(settings_for(url))
    async with lifespan_client(app, headers=AUTH) as client:
        response = await client.post("/v1/chat/completions", json={**BODY, "model": "PaddleOCR-VL"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"  # the next probe (health_interval 0.2 s)
    error = response.json()["error"]
    assert "connection refused" in error["message"]
    assert url in error["message"]


async def test_backend_dying_between_probes_gives_502_naming_it() -> None:
    """A backend healthy at its last probe that stops listening: 502 naming the cause."""
    server = ThreadedServer(FakeVLLM()).__enter__()
    app = create_app(settings_for(server.url, health_interval=3600))
    async with lifespan_client(app, headers=AUTH) as client:
        await asyncio.to_thread(server.__exit__)
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "could not connect to any backend" in message
    assert server.url in message


async def test_fails_over_to_the_next_backend_before_anything_was_sent(fake: FakeVLLM) -> None:
    """A refused connection to one backend moves the request to another; the client sees 200."""
    dying = ThreadedServer(FakeVLLM()).__enter__()
    app = create_app(settings_for(dying.url, fake.url, health_interval=3600))
    async with lifespan_client(app, headers=AUTH) as client:
        await asyncio.to_thread(dying.__exit__)
        statuses = [
            (await client.post("/v1/chat/completions", json=BODY)).status_code for _ in range(4)
        ]
    assert statuses == [200] * 4
    assert len(fake.bodies) == 4


# vLLM 0.32's answer to a new request while it drains on SIGTERM (`shutdown-timeout`), byte for
# byte as the real engine gave it (docs/operations.md#stopping-and-restarts)
DRAINING = (b'{"error":{"message":"cannot schedule new futures after shutdown",'
            b'"type":"InternalServerError","param":null,"code":500}}')  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
async def test_a_draining_backends_refusal_moves_the_page_to_another(
    fake: FakeVLLM, stream: bool
) -> None:
    """A fake engine answering as vLLM does while it drains (500, nothing ran): the page goes
    to the other backend, the client sees 200, and the draining one leaves the rotation."""
    draining = FakeVLLM(mode="status", status=500, error_body=DRAINING)
    with ThreadedServer(draining) as stopping:
        app = create_app(settings_for(stopping.url, fake.url, health_interval=3600))
        async with lifespan_client(app, headers=AUTH) as client:
            statuses = [
                (await client.post("/v1/chat/completions", json={**BODY, "stream": stream}))
                .status_code for _ in range(4)
            ]  # fmt: skip
            ready = await client.get("/ready")
    assert statuses == [200] * 4
    assert len(fake.bodies) == 4
    assert len(draining.bodies) >= 1  # it was asked, and refused
    assert ready.json()["backends"] == [fake.url]  # out of rotation until a probe finds it


async def test_a_backend_500_that_is_not_a_drain_is_passed_on(fake: FakeVLLM) -> None:
    """Any other 500 of a backend is the client's answer, not moved elsewhere (a page that
    breaks engines must not break them all)."""
    broken = FakeVLLM(mode="status", status=500)
    with ThreadedServer(broken) as failing:
        app = create_app(settings_for(failing.url, health_interval=3600))
        async with lifespan_client(app, headers=AUTH) as client:
            response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "boom"


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_closes_the_upstream_request(fake: FakeVLLM, stream: bool) -> None:
    """A client that gives up, waiting or mid-stream, makes the gateway close the upstream."""
    fake.mode = "slow_stream" if stream else "hang"
    with ThreadedServer(create_app(settings_for(fake.url))) as gateway:
        async with httpx.AsyncClient(base_url=gateway.url, headers=AUTH) as client:
            flowing = asyncio.Event()  # the client has the stream's first chunk

            async def call() -> None:
                async with client.stream(
                    "POST", "/v1/chat/completions", json={**BODY, "stream": stream}
                ) as response:
                    async for _ in response.aiter_raw():
                        flowing.set()

            task = asyncio.create_task(call())
            # waiting: the engine has the request; streaming: its chunks reach the client
            assert await asyncio.to_thread(fake.chat_started.wait, 15), "the engine got nothing"
            if stream:
                await asyncio.wait_for(flowing.wait(), 15)
            task.cancel()  # httpx closes the connection: the client is gone
            with pytest.raises(asyncio.CancelledError):
                await task
        assert await asyncio.to_thread(fake.disconnected.wait, 10), "upstream left running"


async def test_backend_refusing_the_gateways_key_is_a_502_not_a_401(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """vLLM's 401 means our backend key is wrong: the client must not get AuthenticationError."""
    fake.mode, fake.status, fake.error_body = "status", 401, b'{"error":"Unauthorized"}'
    response = await gateway_client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "backend_auth_failed"
    assert "OCRVL_BACKEND_API_KEY" in error["message"]


async def test_an_https_backend_under_a_private_ca_is_served_with_its_ca_file(
    certificate: tuple[Path, Path],
) -> None:
    """OCRVL_UPSTREAM_CA_FILE names the CA of an https:// backend's certificate: its probe finds
    it ready and the page goes to it over TLS, answered as over plain http."""
    cert, key = certificate
    fake = FakeVLLM()
    with ThreadedServer(fake, ssl_certfile=str(cert), ssl_keyfile=str(key)) as server:
        url = server.url.replace("http://", "https://")
        app = create_app(settings_for(url, upstream_ca_file=cert, health_interval=3600))
        async with lifespan_client(app, headers=AUTH) as client:
            response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200
    assert response.content == orjson.dumps(completion(SERVED))
    assert len(fake.bodies) == 1


async def test_an_https_backend_under_a_private_ca_is_not_served_without_its_ca_file(
    certificate: tuple[Path, Path],
) -> None:
    """certifi's CAs alone do not verify a private CA's certificate: the backend is down (503
    naming the failed verification) and no page reaches it."""
    cert, key = certificate
    fake = FakeVLLM()
    with ThreadedServer(fake, ssl_certfile=str(cert), ssl_keyfile=str(key)) as server:
        url = server.url.replace("http://", "https://")
        app = create_app(settings_for(url, health_interval=3600))
        async with lifespan_client(app, headers=AUTH) as client:
            response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert "TLS handshake failed" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert fake.bodies == []
