"""Running ASGI apps for tests: in-process with their lifespan, or on a real loopback socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def empty_lifespan(
    receive: Receive, send: Send, stopping: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Answer the lifespan protocol for an app that has nothing to start, and nothing to stop
    but `stopping` (awaited before the shutdown completes)."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    if stopping is not None:
        await stopping()
    await send({"type": "lifespan.shutdown.complete"})


async def read_body(receive: Receive) -> bytes:
    """A request's whole body, from however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


@contextlib.asynccontextmanager
async def lifespan_client(app: ASGIApp, **client_options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on `app` through ASGITransport, with the app's lifespan run around it.

    ASGITransport runs no lifespan and passes no lifespan state, so this does what uvicorn does:
    start the lifespan, then copy its state into every request's scope.
    """
    state: dict[str, Any] = {}
    to_app: asyncio.Queue[Message] = asyncio.Queue()
    from_app: asyncio.Queue[Message] = asyncio.Queue()

    async def receive() -> Message:
        return await to_app.get()

    async def send(message: Message) -> None:
        await from_app.put(message)

    lifespan = asyncio.create_task(app({"type": "lifespan", "state": state}, receive, send))
    await to_app.put({"type": "lifespan.startup"})
    started = await from_app.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"lifespan failed to start: {started}")

    async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "state": dict(state)}, receive, send)

    transport = httpx.ASGITransport(app=with_state)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", **client_options
        ) as client:
            yield client
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await from_app.get()
        await lifespan


class ThreadedServer:
    """A uvicorn server for `app` on a loopback address and port, in a thread of its own."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        options = {"log_level": "warning", "lifespan": "on", **config}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server failed to start")
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


Served = TypeVar("Served")


@contextlib.contextmanager
def serving(app: Served) -> Iterator[Served]:
    """`app` (an ASGI app with a `url` attribute, e.g. FakeVLLM) served on a loopback port, its
    `url` set to the server's."""
    with ThreadedServer(app) as server:  # type: ignore[arg-type]
        app.url = server.url  # type: ignore[attr-defined]
        yield app


# A block for the main process and one for each of `make test`'s four xdist workers: 20000-32499,
# below the kernel's ephemeral range. Two checkouts testing side by side on one machine give each
# its own range (OCRVL_TEST_PORT_BASE=2000 OCRVL_TEST_PORT_BLOCK=1000: 2000-6999).
PORT_BASE = int(os.environ.get("OCRVL_TEST_PORT_BASE", "20000"))
PORT_BLOCK = int(os.environ.get("OCRVL_TEST_PORT_BLOCK", "2500"))
_ports = random.Random()  # its own: a test that seeds `random` does not choose the ports
_given: set[int] = set()  # ports this process handed out: never twice while the block has others


def free_port(*, udp: bool = False) -> int:
    """A loopback port that was free a moment ago (for servers that cannot take a socket), for
    TCP, and for UDP too with `udp` (dnsmasq listens on both).

    Below the kernel's ephemeral range (32768-60999 by default), so no outgoing connection takes
    it meanwhile, and in a block of its own for each xdist worker (`make test` runs the
    in-process tier on four), so two workers never pick the same one. Never one this process
    handed out already: two parts a test starts get two ports even before either binds (CI
    once drew one port for a gateway and its layout service).
    """
    return free_ports(1, udp=udp)


def free_ports(count: int, *, udp: bool = False) -> int:
    """The first of `count` consecutive free loopback ports (`make serve` numbers its engines'
    ports on from VLLM_PORT), none handed out before by this process; see free_port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    index = int(worker[2:]) + 1 if worker[:2] == "gw" and worker[2:].isdigit() else 0
    low = PORT_BASE + index * PORT_BLOCK
    kinds = (socket.SOCK_STREAM, socket.SOCK_DGRAM) if udp else (socket.SOCK_STREAM,)
    for fresh_only in (True, False):  # the second round once the block's fresh ones are out
        if not fresh_only:
            _given.clear()  # the early ones' servers are long gone
        for _ in range(500):
            first = _ports.randrange(low, low + PORT_BLOCK - count + 1)
            run = range(first, first + count)
            if fresh_only and not _given.isdisjoint(run):
                continue
            if all(_bindable(port, kind) for port in run for kind in kinds):
                _given.update(run)
                return first
    raise RuntimeError(f"no {count} free loopback ports in {low}-{low + PORT_BLOCK - 1}")


def _bindable(port: int, kind: socket.SocketKind) -> bool:
    with socket.socket(socket.AF_INET, kind) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A loopback URL where nothing listens: connections are refused at once."""
    yield f"http://127.0.0.1:{free_port()}"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after waiting up to `timeout` s for each (a pidfd: readable once
    the process has exited; no polling)."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([handle], [], [], max(deadline - time.monotonic(), 0))
        finally:
            os.close(handle)
        if not ready:
            alive.append(pid)
    return alive


def ignored_signals(pid: int) -> set[int]:
    """The signals process `pid` ignores (its SigIgn mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}
