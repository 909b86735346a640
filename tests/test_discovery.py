"""DNS discovery against a real DNS server (dnsmasq), and a gateway that follows its records."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from app.backends import BackendPool
from app.discovery import Discovery
from app.main import create_app
from app.settings import BackendSpec, Settings, split_host_port
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.dnsmasq import DOMAIN, Dnsmasq
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.servers import ThreadedServer, lifespan_client
from tests.support.waits import WAIT, until

pytestmark = pytest.mark.anyio

NAME = f"vllm-headless.ocrvl.svc.{DOMAIN}"
PAGE = {"model": SERVED, "messages": [{"role": "user", "content": "OCR:"}]}


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[Dnsmasq]:
    """A real dnsmasq on a loopback port, serving what the test publishes."""
    with Dnsmasq(tmp_path) as server:
        yield server


@pytest.fixture
def ocrvl_logs(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    """caplog, seeing the `ocrvl` loggers (which `logs.configure` detaches from the root)."""
    monkeypatch.setattr(logging.getLogger("ocrvl"), "propagate", True)
    caplog.set_level(logging.INFO, logger="ocrvl")
    return caplog


def discovery(dnsmasq: Dnsmasq, *entries: str) -> Discovery:
    specs = [BackendSpec.parse(entry) for entry in entries]
    return Discovery(specs, dnsmasq.address, timeout=0.5)


async def test_every_record_is_a_backend(dnsmasq: Dnsmasq) -> None:
    """Every A/AAAA record is a backend http://ADDR:PORT (IPv6 in brackets), capacity kept."""
    dnsmasq.publish({NAME: ["127.0.0.3", "127.0.0.2", "::1"]})
    found = await discovery(
        dnsmasq, "http://static:8000;capacity=2", f"dns+http://{NAME}:8000;capacity=8"
    ).members()
    assert found == [
        BackendSpec("http://static:8000", 2),
        BackendSpec("http://127.0.0.2:8000", 8),
        BackendSpec("http://127.0.0.3:8000", 8),
        BackendSpec("http://[::1]:8000", 8),
    ]
    assert not any(spec.discover for spec in found)


async def test_members_follow_the_records(
    dnsmasq: Dnsmasq, ocrvl_logs: pytest.LogCaptureFixture
) -> None:
    """Records added join, records removed leave, and a name with none (NXDOMAIN) has no members."""
    finder = discovery(dnsmasq, f"dns+http://{NAME}:8000")
    dnsmasq.publish({NAME: ["127.0.0.2"]})
    first = [spec.url for spec in await finder.members()]
    dnsmasq.publish({NAME: ["127.0.0.2", "127.0.0.3"]})
    grown = [spec.url for spec in await finder.members()]
    dnsmasq.publish({NAME: ["127.0.0.3"]})
    shrunk = [spec.url for spec in await finder.members()]
    dnsmasq.publish({NAME: []})
    assert await finder.members() == []
    assert first == ["http://127.0.0.2:8000"]
    assert grown == ["http://127.0.0.2:8000", "http://127.0.0.3:8000"]
    assert shrunk == ["http://127.0.0.3:8000"]
    warnings = [r for r in ocrvl_logs.records if r.levelno >= logging.WARNING]
    assert warnings == []  # an empty answer is an answer, not a failure


async def test_failed_resolution_keeps_the_last_members(
    dnsmasq: Dnsmasq, ocrvl_logs: pytest.LogCaptureFixture
) -> None:
    """While DNS does not answer, the last members stay (logged once); then it recovers."""
    finder = discovery(dnsmasq, f"dns+http://{NAME}:8000")
    dnsmasq.publish({NAME: ["127.0.0.2", "127.0.0.3"]})
    before = await finder.members()
    dnsmasq.stop()
    during = [await finder.members() for _ in range(3)]
    dnsmasq.start()
    dnsmasq.publish({NAME: ["127.0.0.3"]})
    after = await finder.members()
    assert during == [before] * 3
    assert len(before) == 2
    warnings = [r.getMessage() for r in ocrvl_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per outage, not once per probe round
    assert "keeping its 2 last known backend(s)" in warnings[0]
    assert f"resolving {NAME} works again" in ocrvl_logs.text
    assert [spec.url for spec in after] == ["http://127.0.0.3:8000"]


async def test_pool_reconcile_keeps_survivors_and_adds_newcomers_unhealthy() -> None:
    """A survivor keeps its Backend (health, in-flight count); a newcomer waits for a probe."""
    async with httpx.AsyncClient() as client:
        pool = BackendPool([BackendSpec("http://a:1")], client, {}, timeout=1)
    survivor = pool.backends[0]
    survivor.healthy, survivor.in_flight = True, 3
    pool.reconcile([BackendSpec("http://a:1", 4), BackendSpec("http://b:1", 2)])
    assert pool.backends[0] is survivor
    assert (survivor.healthy, survivor.in_flight) == (True, 3)
    newcomer = pool.backends[1]
    assert (newcomer.url, newcomer.healthy, newcomer.problem) == (
        "http://b:1",
        False,
        "not probed yet",
    )
    assert newcomer.capacity == 2  # from its entry (a dns+ entry's capacity, for every address)
    pool.reconcile([BackendSpec("http://b:1", 2)])
    assert [backend.url for backend in pool.backends] == ["http://b:1"]
    assert pool.healthy() == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1", ("127.0.0.1", 53)),
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("[::1]:5353", ("::1", 5353)),
        ("::1", ("::1", 53)),
    ],
)
def test_dns_server_forms(value: str, expected: tuple[str, int]) -> None:
    """OCRVL_DNS_SERVER takes an address with or without a port, IPv6 bracketed or bare."""
    assert settings_for("http://a:1", dns_server=value).dns_server == value
    assert split_host_port(value, default_port=53) == expected


@pytest.mark.parametrize("value", ["dns.internal:53", "127.0.0.1:0", "127.0.0.1:x", "[::1]:"])
def test_dns_server_must_be_an_address(value: str) -> None:
    """A name (which would need DNS itself), a bad port or a malformed address is refused."""
    with pytest.raises(ValidationError, match=r"OCRVL_DNS_SERVER must be an IP|expected HOST"):
        settings_for("http://a:1", dns_server=value)


# ------------------------------------------------------------------- a gateway following DNS


@dataclass
class HeldVLLM(FakeVLLM):
    """A FakeVLLM whose chat answers wait until `release` is set (a page still being read),
    counting the health probes it was sent."""

    release: threading.Event = field(default_factory=threading.Event)
    held: int = 0
    probes: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            self.probes += 1
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            self.held += 1
            await asyncio.to_thread(self.release.wait, 30)
        await super().__call__(scope, receive, send)


@pytest.fixture
def pods() -> Iterator[tuple[HeldVLLM, HeldVLLM]]:
    """Two backends on one port of two loopback addresses, as two pods behind one Service."""
    first, second = HeldVLLM(), HeldVLLM()
    for backend in (first, second):
        backend.release.set()
    with (
        ThreadedServer(first, host="127.0.0.2") as one,
        ThreadedServer(second, host="127.0.0.3", port=one.port) as two,
    ):
        first.url, second.url = one.url, two.url
        yield first, second


@pytest.fixture
async def gateway(
    pods: tuple[HeldVLLM, HeldVLLM], dnsmasq: Dnsmasq
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process, its only backend entry `dns+http://NAME:PORT`."""
    port = pods[0].url.rsplit(":", 1)[1]
    dnsmasq.publish({NAME: ["127.0.0.2"]})
    settings: Settings = settings_for(
        f"dns+http://{NAME}:{port}", dns_server=dnsmasq.address, connect_timeout=0.5
    )
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(create_app(settings), headers=headers) as client:
        yield client


async def ready_backends(client: httpx.AsyncClient) -> list[str]:
    response = await client.get("/ready")
    return list(response.json().get("backends", [])) if response.status_code == 200 else []


async def wait_for_ready(client: httpx.AsyncClient, expected: list[str]) -> None:
    """Wait (a few probe rounds, WAIT seconds at most) until /ready lists exactly `expected`."""
    deadline = time.monotonic() + WAIT
    while (listed := await ready_backends(client)) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"/ready lists {listed} after {WAIT:g} s, expected {expected}")
        await asyncio.sleep(0.1)


async def pages(client: httpx.AsyncClient, count: int) -> list[int]:
    answers = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=PAGE) for _ in range(count))
    )
    return [answer.status_code for answer in answers]


async def test_gateway_follows_pods_that_come_and_go(
    gateway: httpx.AsyncClient,
    pods: tuple[HeldVLLM, HeldVLLM],
    dnsmasq: Dnsmasq,
    ocrvl_logs: pytest.LogCaptureFixture,
) -> None:
    """Pods join after a good probe and leave with their records; in-flight pages still finish."""
    first, second = pods
    await wait_for_ready(gateway, [first.url])
    assert await pages(gateway, 4) == [200] * 4
    assert (len(first.bodies), len(second.bodies)) == (4, 0)

    second.mode = "unhealthy"  # a pod in DNS whose engine is not up yet: joins, does not serve
    probed = second.probes
    dnsmasq.publish({NAME: ["127.0.0.2", "127.0.0.3"]})
    # four probe rounds reached it (a round starts once the one before it has ended: three
    # answers of 503 recorded)
    await until(lambda: second.probes >= probed + 4, "the pod in DNS was never probed 4 times")
    assert await ready_backends(gateway) == [first.url]
    second.mode = "ok"
    await wait_for_ready(gateway, [first.url, second.url])

    second.mode = "unhealthy"  # so that both held pages go to the pod that is about to leave
    await wait_for_ready(gateway, [first.url])
    first.release.clear()
    held = first.held
    in_flight = [
        asyncio.create_task(gateway.post("/v1/chat/completions", json={**PAGE, "stream": s}))
        for s in (False, True)
    ]
    await until(lambda: first.held == held + 2, "the two pages did not both reach the first pod")
    second.mode = "ok"
    await wait_for_ready(gateway, [first.url, second.url])
    dnsmasq.publish({NAME: ["127.0.0.3"]})
    await wait_for_ready(gateway, [second.url])
    served_before = len(first.bodies)
    assert await pages(gateway, 4) == [200] * 4
    assert len(second.bodies) == 4  # the pod that joined through DNS serves
    first.release.set()
    page, stream = await asyncio.gather(*in_flight)
    assert (page.status_code, stream.status_code) == (200, 200)
    assert page.json()["choices"][0]["message"]["content"] == "Hello page"
    assert stream.text.endswith("data: [DONE]\n\n")
    assert len(first.bodies) == served_before + 2  # the held two, nothing sent after it left
    assert f"backend {first.url} left the pool" in ocrvl_logs.text

    dnsmasq.stop()  # DNS down: the members stay as they were
    await until(
        lambda: "keeping its 1 last known backend(s)" in ocrvl_logs.text,
        "the failed resolution was never logged",
    )
    assert await ready_backends(gateway) == [second.url]
    assert await pages(gateway, 2) == [200] * 2


async def test_no_address_yet_names_the_dns_entry(dnsmasq: Dnsmasq) -> None:
    """With no record for the name, /ready is 503 and says DNS found no address for it."""
    settings = settings_for(f"dns+http://{NAME}:8000", dns_server=dnsmasq.address)
    async with lifespan_client(create_app(settings)) as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    assert f"DNS discovery found no address for http://{NAME}:8000" in response.text
