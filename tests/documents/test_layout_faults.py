"""The layout pipeline when things go wrong or get busy, in-process: a layout service that is
slow, failing or gone; a client that leaves mid-page; a busy backend (admission counts a
block by its work); usage counting pages; a job giving /v1/ocr's answer."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from app.documents.layout_options import LayoutOptions
from app.documents.layouts import open_layouts
from app.errors import LayoutUnavailable
from app.main import create_app
from tests.conftest import settings_for
from tests.documents.test_layout_gateway import (
    AUTH,
    Answering,
    gateway,
    page_png,
    services,
    upload,
)
from tests.support.documents import pdf
from tests.support.layout_standin import LayoutStandin, box
from tests.support.prometheus import metric
from tests.support.servers import ThreadedServer, read_body, refused_url, serving

pytestmark = pytest.mark.anyio
TEXT = [box("text", 40, 100 + 30 * i, 300, 120 + 30 * i) for i in range(20)]


async def test_a_slow_layout_service_is_a_503_after_the_timeout_not_a_hang() -> None:
    """The service takes the page and never answers: after OCRVL_LAYOUT_TIMEOUT the page is a
    503 layout_unavailable with Retry-After; the model is never asked."""
    with services(mode="hold") as (fake, layout):
        async with gateway(fake, layout, layout_timeout=0.5) as client:
            started = time.monotonic()
            response = await client.post("/v1/ocr", files=upload())
            took = time.monotonic() - started
    assert layout.arrived.is_set()
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "layout_unavailable"
    assert "did not answer within 0.5 s (OCRVL_LAYOUT_TIMEOUT)" in error["message"]
    assert int(response.headers["retry-after"]) >= 1
    assert took < 30
    assert fake.bodies == []


@pytest.mark.parametrize(
    ("mode", "status", "code"),
    [
        ("status", 503, "layout_unavailable"),  # a 5xx of the service
        ("malformed", 502, "layout_failed"),
        ("wrong_size", 502, "layout_failed"),
    ],
)
async def test_a_failing_layout_service_fails_the_page_in_openais_shape(
    mode: str, status: int, code: str
) -> None:
    """A 5xx from the service is a 503 with Retry-After; an answer its API does not allow (a
    malformed body, boxes for another page size) a 502; the gateway keeps serving."""
    with services(mode=mode) as (fake, layout):
        async with gateway(fake, layout) as client:
            response = await client.post("/v1/ocr", files=upload())
            again = await client.post("/v1/ocr", files=upload(), data={"layout": "off"})
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert ("retry-after" in response.headers) == (status == 503)
    assert again.status_code == 200


async def test_a_page_failing_its_layout_leaves_the_others_read() -> None:
    """Two pages, the service answers only the first: page 1 has its blocks, page 2 carries
    the 503 as its error; the document is a 200."""
    layout = LayoutStandin(boxes=lambda w, h, n: [box("text", 10, 10, 200, 40)])
    original = layout._layout

    async def second_fails(body: bytes, send: object) -> None:
        if layout.seen:
            layout.mode = "status"
        await original(body, send)  # type: ignore[arg-type]

    layout._layout = second_fails  # type: ignore[method-assign]
    with serving(Answering()) as fake, serving(layout):
        async with gateway(fake, layout, ocr_page_concurrency=1) as client:
            response = await client.post("/v1/ocr", files=upload(pdf(2), "doc.pdf"))
    assert response.status_code == 200
    first, second = response.json()["pages"]
    assert first["blocks"][0]["text"] == "Some words"
    assert second["error"]["code"] == "layout_unavailable"
    assert response.headers["x-ocr-pages-failed"] == "1"


async def test_pages_go_to_a_service_that_answers_when_another_is_gone() -> None:
    """OCRVL_LAYOUT_URL lists a dead address and a live service: every page gets its layout
    from the live one (the dead one is out of rotation, or refused and skipped)."""
    with services() as (fake, layout), refused_url() as dead:
        async with gateway(fake, f"{dead},{layout.url}") as client:
            responses = [await client.post("/v1/ocr", files=upload()) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert all(r.json()["layout"] == "on" for r in responses)
    assert len(layout.seen) == 3


async def test_pages_are_shared_between_two_live_services() -> None:
    """OCRVL_LAYOUT_URL lists two live services: pages asked one after another go to each in
    turn (balanced as backends are: the fewest in flight, ties taken in rotation)."""
    with services() as (fake, first), serving(LayoutStandin(boxes=lambda w, h, n: TEXT)) as second:
        async with gateway(fake, f"{first.url},{second.url}") as client:
            responses = [await client.post("/v1/ocr", files=upload()) for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert (len(first.seen), len(second.seen)) == (2, 2)


async def test_a_twenty_block_page_does_not_take_twenty_pages_of_capacity() -> None:
    """With a backend of capacity 3 pages, all 20 blocks of a page are in flight at once: a
    260 x 20 px line grows to 1,232 x 112 px at min_pixels, 176 visual tokens, and 20 x 176 =
    3,520 units are under 3 x 1,280 (a page counted as a page: 3 at a time)."""
    with services(TEXT) as (fake, layout):
        fake.hold, fake.target = True, 20
        async with gateway(fake, layout, backends=[f"{fake.url};capacity=3"]) as client:
            answer = asyncio.create_task(client.post("/v1/ocr", files=upload()))
            reached = await anyio.to_thread.run_sync(fake.reached.wait, 30)
            fake.release.set()
            response = await answer
    assert reached, f"only {fake.most} blocks were in flight at once"
    assert response.status_code == 200
    assert fake.most == 20
    assert len(response.json()["pages"][0]["blocks"]) == 20


async def test_a_busy_backend_queues_blocks_by_their_work() -> None:
    """Capacity 1 page (1,280 units): blocks of 176 units are admitted while the work in flight
    is under it, so 8 run at once (7 x 176 = 1,232 < 1,280) and the rest wait their turn."""
    with services(TEXT) as (fake, layout):
        fake.hold, fake.target = True, 8
        async with gateway(fake, layout, backends=[f"{fake.url};capacity=1"]) as client:
            answer = asyncio.create_task(client.post("/v1/ocr", files=upload()))
            reached = await anyio.to_thread.run_sync(fake.reached.wait, 30)
            fake.release.set()
            response = await answer
    assert reached
    assert fake.most == 8
    assert response.status_code == 200


async def test_usage_counts_the_documents_pages_not_its_blocks(tmp_path: Path) -> None:
    """A 2-page PDF of 20 blocks a page counts 2 pages (one request) for the key, with the
    tokens of all 40 blocks."""
    with services(TEXT) as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            response = await client.post("/v1/ocr", files=upload(pdf(2), "doc.pdf"))
            usage = (await client.get("/v1/usage")).json()["total"]
    assert response.status_code == 200
    assert len(fake.bodies) == 40
    assert (usage["requests"], usage["pages"]) == (1, 2)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (400, 80)


def test_a_client_that_leaves_closes_every_block_upstream() -> None:
    """The client leaves while a page's blocks hang at the backend: every block in flight is
    closed upstream (vLLM would abort it) and no further block starts."""
    fake = Answering(mode="hang")
    fake.target = 3
    layout = LayoutStandin(boxes=lambda w, h, n: TEXT[:6])
    with serving(fake), serving(layout):
        settings = settings_for(
            fake.url, layout_url=layout.url, preprocess_workers=1, ocr_block_concurrency=3
        )
        with (
            ThreadedServer(create_app(settings), lifespan="on") as server,
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client,
        ):
            with client.stream(
                "POST", "/v1/ocr", files=upload(), data={"stream": "true"}
            ) as response:
                assert response.status_code == 200
                assert fake.reached.wait(30), "three blocks never reached the backend"
            # the client is gone: wait until the gateway has ended the request
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                text = client.get("/metrics").text
                if metric(text, "ocrvl_requests_in_flight") == 0 and fake.gone == 3:
                    break
                time.sleep(0.05)
    assert fake.gone == 3
    assert len(fake.bodies) == 3


async def test_a_job_with_a_layout_gives_v1_ocrs_answer(tmp_path: Path) -> None:
    """A job of a 2-page PDF, layout on, ends with the same pages (blocks and markdown) as
    /v1/ocr gives for the file; its result says the layout was on."""
    with services(TEXT[:3]) as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            files = upload(pdf(2), "doc.pdf")
            submitted = await client.post("/v1/ocr/jobs", files=files, data={"layout": "on"})
            assert submitted.status_code == 202, submitted.text
            job_id = submitted.json()["id"]
            for _ in range(60):
                job = (await client.get(f"/v1/ocr/jobs/{job_id}", params={"wait": "5"})).json()
                if job["status"] not in ("queued", "running"):
                    break
            result = await client.get(f"/v1/ocr/jobs/{job_id}/result")
            direct = await client.post("/v1/ocr", files=upload(pdf(2), "doc.pdf"))
    assert (job["status"], job["layout"], job["pages_done"]) == ("succeeded", "on", 2)
    assert result.json() == direct.json()
    assert result.json()["layout"] == "on"
    assert len(result.json()["pages"][1]["blocks"]) == 3
    markdown = orjson.loads(result.content)["pages"][0]["markdown"]
    assert markdown == "\n\n".join(["Some words"] * 3)


async def test_a_job_waits_for_the_layout_service_it_was_promised(tmp_path: Path) -> None:
    """A job submitted with `auto` while the service is not ready still runs with a layout:
    its pages wait (and retry) until the service answers, as they wait for backends."""
    with services(TEXT[:2], ready=False) as (fake, layout):
        async with gateway(fake, layout, data_dir=tmp_path) as client:
            submitted = await client.post("/v1/ocr/jobs", files=upload(page_png()))
            assert submitted.status_code == 202
            assert submitted.json()["layout"] == "on"
            layout.ready = True
            job_id = submitted.json()["id"]
            for _ in range(60):
                job = (await client.get(f"/v1/ocr/jobs/{job_id}", params={"wait": "5"})).json()
                if job["status"] not in ("queued", "running"):
                    break
    assert job["status"] == "succeeded"
    assert len(layout.seen) == 1
    assert len(fake.bodies) == 2


async def _ready_until(client: httpx.AsyncClient, layout_status: str) -> httpx.Response:
    """`/ready` once its answer reports the layout service as `layout_status` (every answer is
    one whole reading of the probes; a 503 reports it in the message)."""
    with anyio.fail_after(60):
        while True:
            response = await client.get("/ready")
            if response.status_code == 200:
                if response.json()["layout"]["status"] == layout_status:
                    return response
            elif layout_status == "down" and "no layout service is ready" in response.text:
                return response
            await anyio.sleep(0.05)


@pytest.mark.parametrize("required", [False, True])
async def test_ready_reports_the_layout_service_and_can_require_it(required: bool) -> None:
    """`/ready` says `layout: ready` (its URL) while the stand-in serves; once it is stopped,
    `layout: down` with why, still 200 by default; with OCRVL_READY_REQUIRES_LAYOUT a 503
    `layout_unavailable` with Retry-After. A gateway without a layout service says `off`."""
    with serving(Answering()) as fake:
        layout = LayoutStandin(boxes=lambda w, h, n: [])
        server = ThreadedServer(layout)
        server.__enter__()
        try:
            async with gateway(fake, server.url, ready_requires_layout=required) as client:
                up = await _ready_until(client, "ready")
                await anyio.to_thread.run_sync(server.__exit__, None, None, None)  # stopped
                down = await _ready_until(client, "down")
        finally:
            server.__exit__(None, None, None)
        async with gateway(fake, None, ready_requires_layout=required) as client:
            off = await client.get("/ready")
    assert up.status_code == 200
    assert up.json()["layout"] == {"status": "ready", "services": [server.url]}
    assert (off.status_code, off.json()["layout"]) == (200, {"status": "off"})
    if not required:
        assert down.status_code == 200
        assert down.json()["layout"]["status"] == "down"
        assert server.url in down.json()["layout"]["problem"]
        return
    assert down.status_code == 503
    assert down.json()["error"]["code"] == "layout_unavailable"
    assert "OCRVL_READY_REQUIRES_LAYOUT" in down.json()["error"]["message"]
    assert int(down.headers["retry-after"]) >= 1


class ReadyCounter:
    """A fake layout service's `GET /ready` (always 200) that records each probe's client
    address: one (host, port) per connection the gateway opened."""

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        host, port = scope["client"]
        self.peers.append((host, port))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"{}"})


async def test_an_idle_layout_connection_is_let_go_by_the_gateway_before_the_service() -> None:
    """The gateway drops a layout connection idle for OCRVL_KEEPALIVE_EXPIRY, as it does the
    engines', so no probe or page is sent on one the service is closing (httpx's own 5 s raced
    uvicorn's 5 s: the 2026-12-05 H200 pass logged "/ready: connection closed mid-answer" and
    the service was out of rotation until the next probe). Probes back to back share one
    connection; probes further apart than the expiry use two."""
    ready = ReadyCounter()
    with ThreadedServer(ready, lifespan="off", timeout_keep_alive=75) as layout:
        settings = settings_for("http://127.0.0.1:1", layout_url=layout.url,
                                keepalive_expiry=0.3, health_interval=3600)  # fmt: skip
        async with AsyncExitStack() as stack:
            service = await open_layouts(settings, stack)
            assert service is not None
            assert service.ready()
            await service.probe_all()  # back to back: the same connection
            await anyio.sleep(0.6)  # idle past the expiry (0.3 s)
            await service.probe_all()
    assert len(ready.peers) == 3
    assert ready.peers[0] == ready.peers[1]
    assert ready.peers[2] != ready.peers[1]


class PrefixedLayout:
    """A fake layout service behind a path prefix (as a proxy would mount it): records each
    page's path and client address; answers `/ready`, and each page with no boxes, or (`drop`)
    with the head and a byte of its body before it fails and its server drops the connection."""

    def __init__(self, *, drop: bool = False) -> None:
        self.drop = drop
        self.pages: list[tuple[str, tuple[str, int]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        head = [(b"content-type", b"application/json")]
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        self.pages.append((scope["path"], tuple(scope["client"])))
        body = orjson.dumps({"results": [{"width": 640, "height": 480, "boxes": []}]})
        if self.drop:
            head.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": body[:1], "more_body": True})
            raise RuntimeError("the fake layout service fails mid-answer")
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": body})


async def test_pages_reach_a_prefixed_service_on_one_kept_alive_connection() -> None:
    """Pages posted one after another go to `{OCRVL_LAYOUT_URL}/v1/layout`, the URL's path kept
    (a service mounted under /layout by a proxy), over one connection the gateway keeps alive
    (the relay's own HTTP client, app/upstream.py), and come back as their boxes."""
    fake = PrefixedLayout()
    with ThreadedServer(fake, lifespan="off") as server:
        settings = settings_for("http://127.0.0.1:1", layout_url=f"{server.url}/layout",
                                keepalive_expiry=30, health_interval=3600)  # fmt: skip
        async with AsyncExitStack() as stack:
            service = await open_layouts(settings, stack)
            assert service is not None
            located = [
                await service.locate("data:image/png;base64,", (640, 480), LayoutOptions(), "r")
                for _ in range(3)
            ]
    assert [(page.boxes, page.size) for page in located] == [([], (640, 480))] * 3
    assert [path for path, _ in fake.pages] == ["/layout/v1/layout"] * 3
    assert len({peer for _, peer in fake.pages}) == 1


async def test_a_service_that_drops_a_page_mid_answer_is_a_503_and_the_next_page_is_sent() -> None:
    """The service sends the head and a byte of the body, then its connection drops: the page is
    a 503 layout_unavailable naming the service (not a hang, not a 500), and the next page goes
    out on a new connection."""
    fake = PrefixedLayout(drop=True)
    with ThreadedServer(fake, lifespan="off") as server:
        settings = settings_for("http://127.0.0.1:1", layout_url=server.url, health_interval=3600)
        async with AsyncExitStack() as stack:
            service = await open_layouts(settings, stack)
            assert service is not None
            failures = []
            for _ in range(2):
                with pytest.raises(LayoutUnavailable) as caught:
                    await service.locate("data:image/png;base64,", (640, 480), LayoutOptions(), "r")
                failures.append(caught.value)
    assert all(f"the layout service {server.url} failed" in str(f) for f in failures)
    assert len(fake.pages) == 2
    assert fake.pages[0][1] != fake.pages[1][1]


async def test_an_https_service_under_a_private_ca_is_probed_and_read_with_its_ca_file(
    certificate: tuple[Path, Path],
) -> None:
    """OCRVL_UPSTREAM_CA_FILE names the CA of an https:// layout service's certificate: its
    probe (httpx) finds it ready and its pages (the relay's client) go to it over TLS; without
    the file, certifi's CAs fail the certificate and the service is not ready."""
    cert, key = certificate
    fake = PrefixedLayout()
    with ThreadedServer(fake, lifespan="off", ssl_certfile=str(cert), ssl_keyfile=str(key)) as tls:
        url = tls.url.replace("http://", "https://")
        settings = settings_for("http://127.0.0.1:1", layout_url=url, health_interval=3600,
                                upstream_ca_file=cert)  # fmt: skip
        async with AsyncExitStack() as stack:
            service = await open_layouts(settings, stack)
            assert service is not None
            assert service.ready()
            page = await service.locate("data:image/png;base64,", (640, 480), LayoutOptions(), "r")
        untrusted = settings_for("http://127.0.0.1:1", layout_url=url, health_interval=3600)
        async with AsyncExitStack() as stack:
            refused = await open_layouts(untrusted, stack)
            assert refused is not None
            assert not refused.ready()
            problems = str(refused.problems())
            assert "TLS handshake failed ([SSL: CERTIFICATE_VERIFY_FAILED]" in problems
    assert (page.boxes, page.size) == ([], (640, 480))
    assert [path for path, _ in fake.pages] == ["/v1/layout"]
