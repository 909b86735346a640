"""Admission on the real engine: bursts shed cleanly, vLLM never queues past what the gateway
admits, a killed backend costs no request that had not started, a queued client can leave."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, GatewayServer, VLLMServer, _stop, start_gateway, wait_until_up
from tests.support.prometheus import metric
from tests.support.servers import free_port
from tests.support.waits import until_metric

pytestmark = [pytest.mark.vllm, pytest.mark.anyio]
CAPACITY = 2


def page(vllm: VLLMServer, tokens: int, *, stream: bool = False) -> dict[str, object]:
    """A request that generates exactly `tokens` tokens on the tiny model."""
    return {
        "model": vllm.served_model_name,
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }


@pytest.fixture(scope="module")
def admitting_gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A gateway that admits CAPACITY pages at once to the engine and queues two more."""
    server = start_gateway(
        vllm_server, Path(tmp_path_factory.mktemp("gw-admission")), ("sk-admission",),
        OCRVL_BACKENDS=f"{vllm_server.url};capacity={CAPACITY}",
        OCRVL_QUEUE_SIZE="2",
    )  # fmt: skip
    yield server
    _stop(server.process)


async def test_a_burst_gets_200s_and_503s_and_vllm_never_queues(
    admitting_gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """4x capacity at once: only 200 and 503 (server_overloaded, Retry-After); vLLM's own
    running count stays within the capacity and its waiting count at 0."""
    headers = {"authorization": f"Bearer {admitting_gateway.api_key}"}
    peaks = {"running": 0.0, "waiting": 0.0}
    done = asyncio.Event()

    async def watch_engine() -> None:
        async with httpx.AsyncClient() as client:
            while not done.is_set():
                text = (await client.get(f"{vllm_server.url}/metrics")).text
                peaks["running"] = max(peaks["running"], metric(text, "vllm:num_requests_running"))
                peaks["waiting"] = max(peaks["waiting"], metric(text, "vllm:num_requests_waiting"))
                await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_engine())
    async with httpx.AsyncClient(base_url=admitting_gateway.url, headers=headers, timeout=120) as c:
        responses = await asyncio.gather(
            *(
                c.post("/v1/chat/completions", json=page(vllm_server, 48, stream=i % 2 == 1))
                for i in range(4 * CAPACITY)
            )
        )
        metrics = (await c.get("/metrics")).text
    done.set()
    await watcher
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= CAPACITY + 2  # the running ones and the queued ones
    for shed in (r for r in responses if r.status_code == 503):
        assert shed.json()["error"]["code"] == "server_overloaded"
        assert int(shed.headers["retry-after"]) >= 1
    assert peaks["running"] <= CAPACITY
    assert peaks["waiting"] == 0
    assert metric(metrics, "ocrvl_shed_total") == statuses.count(503)


async def test_a_client_leaving_the_queue_lets_the_next_one_in(
    admitting_gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """With both slots busy, a queued client that disconnects leaves the queue at once; the
    request behind it takes the next slot that frees."""
    headers = {"authorization": f"Bearer {admitting_gateway.api_key}"}
    long = page(vllm_server, vllm_server.max_model_len - 64)
    async with httpx.AsyncClient(base_url=admitting_gateway.url, headers=headers, timeout=120) as c:
        holders = [
            asyncio.create_task(c.post("/v1/chat/completions", json=long)) for _ in range(CAPACITY)
        ]
        await until_metric(c, "ocrvl_backend_in_flight", CAPACITY)  # both slots are taken
        leaving = asyncio.create_task(c.post("/v1/chat/completions", json=page(vllm_server, 8)))
        await until_metric(c, "ocrvl_queue_depth", 1)  # queued first
        behind = asyncio.create_task(c.post("/v1/chat/completions", json=page(vllm_server, 8)))
        depth = await until_metric(c, "ocrvl_queue_depth", 2)
        leaving.cancel()
        depth_after = await until_metric(c, "ocrvl_queue_depth", 1, timeout=30)
        # ... because the client left, not because a slot freed and let it in
        assert not [h for h in holders if h.done()], "a long request ended while it was queued"
        assert not behind.done()
        holders[0].cancel()  # its slot frees: the request behind takes it
        answer = await asyncio.wait_for(behind, 60)
        holders[1].cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    assert (depth, depth_after) == (2, 1)
    assert answer.status_code == 200


class FakeProcess:
    """FakeVLLM as a process of its own, so the test can SIGKILL it like a crashed engine."""

    def __init__(self, port: int, served: str, log: Path) -> None:
        self.port, self.served, self.log = port, served, log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fake_backend", str(self.port), "0.3",
                 self.served],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            )  # fmt: skip
        wait_until_up(f"{self.url}/health", self.process, self.log, 30)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


async def test_kill_drill_loses_no_request_that_had_not_started(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """The real engine and a second backend under load; the second is killed, then restarted.
    Every non-streaming request succeeds (the killed backend's are replayed on the engine); the
    dead backend leaves rotation within 2 s and is back within 5 s of its restart."""
    fake = FakeProcess(free_port(), vllm_server.served_model_name, tmp_path / "fake.log")
    fake.start()
    gateway = start_gateway(
        vllm_server, tmp_path, ("sk-drill",),
        OCRVL_BACKENDS=f"{vllm_server.url};capacity=4,{fake.url};capacity=4",
    )  # fmt: skip
    headers = {"authorization": "Bearer sk-drill"}
    results: list[tuple[float, int, object]] = []
    stop = asyncio.Event()

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            response = await client.post("/v1/chat/completions", json=page(vllm_server, 4))
            answer = response.json()
            text = answer["choices"][0]["message"]["content"] if response.is_success else answer
            results.append((time.monotonic(), response.status_code, text))

    async def healthy(client: httpx.AsyncClient) -> float:
        return metric(
            (await client.get("/metrics")).text, "ocrvl_backend_healthy", backend=fake.url
        )

    async def until(client: httpx.AsyncClient, value: float, limit: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < limit:
            if await healthy(client) == value:
                return time.monotonic() - started
            await asyncio.sleep(0.05)
        raise AssertionError(f"{fake.url} healthy never became {value} within {limit} s")

    workers: list[asyncio.Task[None]] = []

    async def answered(what: str, done: Callable[[], bool], limit: float = 60) -> None:
        """Wait until `done()` holds of the answers the workers got (a worker that failed
        fails the test here)."""
        deadline = time.monotonic() + limit
        while not done():
            for task in workers:
                if task.done():
                    task.result()
                    raise AssertionError(f"a worker stopped before {what}")
            assert time.monotonic() < deadline, f"not {what} within {limit} s: {results[-5:]}"
            await asyncio.sleep(0.05)

    def by_fake(since: float = 0.0) -> int:
        return sum(1 for t, _, text in results if text == "Hello page" and t > since)

    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
            workers += [asyncio.create_task(worker(client)) for _ in range(6)]
            # under load: both backends have answered
            await answered("both backends serving", lambda: len(results) > by_fake() >= 2)
            fake.kill()
            ejected_after = await until(client, 0.0, 2.0)
            gone = len(results)
            await answered("answers while the backend is out", lambda: len(results) >= gone + 6)
            fake.start()
            restarted = time.monotonic()
            back_after = await until(client, 1.0, 5.0)
            await answered("the restarted backend got a request", lambda: by_fake(restarted) >= 1)
            stop.set()
            await asyncio.gather(*workers)
    finally:
        for task in workers:  # a test failing mid-drill leaves none running
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        _stop(gateway.process)
        if fake.process is not None:
            fake.kill()
    failed = [(status, text) for _, status, text in results if status != 200]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed}"
    served_by_fake_after = [t for t, _, text in results if text == "Hello page" and t > restarted]
    assert served_by_fake_after, "the restarted backend got no request"
    print(f"kill drill: {len(results)} requests, ejected {ejected_after:.2f} s after the kill, "
          f"back {back_after:.2f} s after the restart")  # fmt: skip
