"""The lifespan's shutdown (app/closing.py): each step closes in the reverse order of opening,
timed at debug; a step that never finishes is abandoned with a warning naming it and the bound,
and one that raises is logged with its error; either way the rest still close. Then the same
through the gateway's own lifespan. The steps that hang or fail are fakes, named so: no real part
hangs on demand. Last, a real `ocrvl serve` stopped while a client holds a request open: the
wait for requests (the drain) is bounded too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.closing import Closing
from app.main import create_app
from app.media import MediaPolicy
from app.store.results import SqliteResults
from tests.conftest import BACKEND_KEY, CLIENT_KEY, VENV_BIN, settings_for, wait_until_up
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import free_port, lifespan_client

BOUND = 0.2  # the bound under test: a step that never finishes meets it


class Records(logging.Handler):
    """Every record of the logger it is added to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines() -> Iterator[list[logging.LogRecord]]:
    """The shutdown's log records, debug included (the gateway logs at info)."""
    logger = logging.getLogger("ocrvl.closing")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def steps(lines: list[logging.LogRecord], level: int = logging.DEBUG) -> list[str]:
    return [str(getattr(record, "step", "")) for record in lines if record.levelno == level]


async def keep(closed: list[str], name: str) -> None:
    closed.append(name)


@contextlib.asynccontextmanager
async def opened(closed: list[str], name: str) -> AsyncIterator[str]:
    try:
        yield name
    finally:
        closed.append(name)


@pytest.mark.anyio
async def test_steps_close_in_the_reverse_order_of_opening_each_timed_at_debug(
    lines: list[logging.LogRecord],
) -> None:
    """A callback, an async callback and a context close last-opened first, each with a debug
    line naming it (its place in the opening order, what closes) and its duration."""
    closed: list[str] = []
    async with Closing(5) as stack:
        stack.callback(closed.append, "callback")
        stack.push_async_callback(keep, closed, "async callback")
        assert await stack.enter_async_context(opened(closed, "context")) == "context"
    assert closed == ["context", "async callback", "callback"]
    assert steps(lines) == ["#3 opened", "#2 keep(list, str)", "#1 list.append(str)"]
    for record in lines[:-1]:
        assert record.getMessage().startswith(f"shutdown: closed {record.__dict__['step']} in ")
        assert record.__dict__["seconds"] >= 0
    assert lines[-1].levelno == logging.INFO
    assert lines[-1].getMessage().startswith("shutdown: 3 step(s) closed in ")
    assert lines[-1].getMessage().endswith("; abandoned: none; failed: none")


@pytest.mark.anyio
async def test_a_step_that_never_finishes_is_abandoned_and_the_rest_still_close(
    lines: list[logging.LogRecord],
) -> None:
    """A step still running at the bound is cancelled and left: the shutdown ends, a WARNING
    names the step and the bound, and the steps opened before it close after it."""
    closed: list[str] = []
    cancelled = asyncio.Event()

    async def fake_close_that_never_finishes() -> None:
        try:
            await asyncio.Event().wait()  # nobody sets it: a store that stopped answering
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with Closing(BOUND) as stack:
        stack.callback(closed.append, "opened first")
        stack.push_async_callback(fake_close_that_never_finishes)
        stack.callback(closed.append, "opened last")
    assert closed == ["opened last", "opened first"]
    await cancelled.wait()
    (warning,) = [record for record in lines if record.levelno == logging.WARNING]
    message = warning.getMessage()
    assert "#2 " in message
    assert "fake_close_that_never_finishes" in message
    assert f"within {BOUND:g} s (OCRVL_CLOSE_TIMEOUT)" in message
    assert [str(getattr(record, "step", "")).split(" ")[0] for record in lines[:-1]] == [
        "#3", "#2", "#1"
    ]  # fmt: skip
    assert f"abandoned: #2 {fake_close_that_never_finishes.__qualname__}; failed: none" in (
        lines[-1].getMessage()
    )


@pytest.mark.anyio
async def test_a_step_that_swallows_its_cancellation_does_not_hold_the_shutdown(
    lines: list[logging.LogRecord],
) -> None:
    """A step that ignores being cancelled (an await under suppress(CancelledError), as a
    background task's close does) is left running; the shutdown goes on without it."""
    closed: list[str] = []
    release = asyncio.Event()

    async def fake_close_deaf_to_cancellation() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    closing = Closing(BOUND)
    async with closing as stack:
        stack.callback(closed.append, "opened first")
        stack.push_async_callback(fake_close_deaf_to_cancellation)
    assert closed == ["opened first"]
    assert "fake_close_deaf_to_cancellation" in steps(lines, logging.WARNING)[0]
    (abandoned,) = closing.abandoned
    assert not abandoned.done()
    release.set()  # the test's own clean-up: the fake ends
    await abandoned


@pytest.mark.anyio
async def test_a_step_that_raises_is_logged_with_its_error_and_the_rest_still_close(
    lines: list[logging.LogRecord],
) -> None:
    """An async or synchronous step that raises is logged (ERROR, its error and traceback);
    the shutdown itself raises nothing and every other step closes."""
    closed: list[str] = []

    async def fake_close_that_fails() -> None:
        raise OSError("the disk went away")

    def fake_sync_close_that_fails() -> None:
        raise RuntimeError("closed twice")

    async with Closing(5) as stack:
        stack.callback(closed.append, "opened first")
        stack.push_async_callback(fake_close_that_fails)
        stack.callback(fake_sync_close_that_fails)
        stack.callback(closed.append, "opened last")
    assert closed == ["opened last", "opened first"]
    errors = [record for record in lines if record.levelno == logging.ERROR]
    assert [record.getMessage().split(" failed")[0] for record in errors] == [
        f"shutdown: #3 {fake_sync_close_that_fails.__qualname__}",
        f"shutdown: #2 {fake_close_that_fails.__qualname__}",
    ]
    assert "(RuntimeError: closed twice)" in errors[0].getMessage()
    assert "(OSError: the disk went away)" in errors[1].getMessage()
    assert all(record.exc_info for record in errors)
    assert steps(lines) == ["#4 list.append(str)", "#1 list.append(str)"]
    assert (
        lines[-1]
        .getMessage()
        .endswith(
            f"failed: #3 {fake_sync_close_that_fails.__qualname__}, "
            f"#2 {fake_close_that_fails.__qualname__}"
        )
    )


@pytest.mark.anyio
async def test_a_context_whose_exit_never_finishes_lets_the_body_s_error_through(
    lines: list[logging.LogRecord],
) -> None:
    """A context's exit is bounded too; the error that ended the body (a start that failed
    halfway) still reaches the caller, and the contexts opened before close."""
    closed: list[str] = []

    class FakeClientThatNeverCloses:
        async def __aenter__(self) -> None:
            return None

        async def __aexit__(self, *_: object) -> None:
            await asyncio.Event().wait()

    async def start_that_fails_halfway() -> None:
        async with Closing(BOUND) as stack:
            await stack.enter_async_context(opened(closed, "context"))
            await stack.enter_async_context(FakeClientThatNeverCloses())
            raise ValueError("the body's error")

    with pytest.raises(ValueError, match="the body's error"):
        await start_that_fails_halfway()
    assert closed == ["context"]
    assert steps(lines, logging.WARNING) == [f"#2 {FakeClientThatNeverCloses.__qualname__}"]


@pytest.mark.anyio
async def test_a_context_s_exit_sees_the_error_and_may_suppress_it() -> None:
    """A context's exit gets the body's error, and suppressing it works as in any exit stack."""
    caught: list[BaseException] = []

    @contextlib.asynccontextmanager
    async def suppressing() -> AsyncIterator[None]:
        try:
            yield
        except KeyError as exc:
            caught.append(exc)

    async with Closing(5) as stack:
        await stack.enter_async_context(suppressing())
        raise KeyError("swallowed by the context")
    assert [str(exc) for exc in caught] == ["'swallowed by the context'"]


@pytest.mark.anyio
async def test_the_gateway_closes_every_part_in_reverse_order_each_logged(
    fake: FakeVLLM, lines: list[logging.LogRecord]
) -> None:
    """The gateway's lifespan closes on Closing: the batches first, then the jobs, the stores,
    the preprocessing pool, the background tasks, the upstream client, metering, and the
    quotas last; each step a debug line, none abandoned."""
    async with lifespan_client(create_app(settings_for(fake.url))):
        pass
    closed = steps(lines)
    assert not [record for record in lines if record.levelno >= logging.WARNING]
    numbers = [int(step.split(" ")[0][1:]) for step in closed]
    assert numbers == sorted(numbers, reverse=True)
    assert numbers[-1] == 1
    names = [step.split(" ", 1)[1] for step in closed]
    opened = [  # in the order open_gateway opens them
        "Quotas.close", "metering", "AsyncClient", "cancelled(BackendPool.watch)",
        "cancelled(trim_when_idle)", "cancelled(Scheduler.watch)", "to_thread(Preprocessor.close)",
        "MediaPolicy.aclose", "Runner.close", "BatchRunner.close",
    ]  # fmt: skip
    assert [name for name in names if name in opened] == opened[::-1]
    assert names[-1] == "Quotas.close"


@pytest.mark.anyio
async def test_a_gateway_part_that_never_closes_holds_no_shutdown(
    fake: FakeVLLM, lines: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the media fetcher's close a fake that never finishes, the lifespan still ends
    (OCRVL_CLOSE_TIMEOUT 2 s): a warning names it, and the parts opened before it (the
    preprocessing pool, the upstream client, the quotas) close after it. (2 s, not BOUND: each
    real part must close within it, a process pool too, on a loaded 2-core CI machine.)"""

    async def fake_aclose_that_never_finishes(self: MediaPolicy) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(MediaPolicy, "aclose", fake_aclose_that_never_finishes)
    async with lifespan_client(create_app(settings_for(fake.url, close_timeout=2.0))):
        pass
    named = [
        (record.levelno, str(getattr(record, "step", "")).split(" ", 1)[-1]) for record in lines
    ]
    at = named.index((logging.WARNING, "MediaPolicy.fake_aclose_that_never_finishes"))
    closed_after = {name for level, name in named[at + 1 :] if level == logging.DEBUG}
    assert {"to_thread(Preprocessor.close)", "AsyncClient", "Quotas.close"} <= closed_after
    assert [level for level, _ in named].count(logging.WARNING) == 1


@pytest.mark.anyio
async def test_a_sqlite_store_closed_under_a_running_statement_leaves_the_loop_free(
    tmp_path: Path, lines: list[logging.LogRecord]
) -> None:
    """A store closed while a statement (a cancelled request's, still in its thread) holds the
    connection: the close waits in a thread, so it is abandoned at the bound with a warning
    naming it (before: it took the connection's lock on the event loop, which froze, bound
    and all, until the statement ended)."""
    store = SqliteResults(tmp_path, ttl=60, max_bytes=1 << 20)
    await store.open()
    running, release = threading.Event(), threading.Event()

    def fake_statement_that_waits(_: sqlite3.Connection) -> None:
        running.set()
        release.wait(60)  # generous: on the old code the frozen loop waits this out, and fails

    statement = asyncio.ensure_future(store._run(fake_statement_that_waits))
    await asyncio.to_thread(running.wait)
    async with Closing(BOUND) as stack:
        stack.push_async_callback(store.close)
    assert steps(lines, logging.WARNING) == ["#1 SqliteResults.close"]
    release.set()
    await statement
    await store.close()  # the test's own: the abandoned close may not have run yet


def test_a_stop_with_an_upload_held_open_drains_for_the_request_timeout_then_closes(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """`ocrvl serve` gets SIGTERM while a client holds a request open, its body never sent: the
    drain gives up after OCRVL_REQUEST_TIMEOUT (1 s here), the request is cancelled, the
    lifespan closes each step (logged) and the process ends (before: uvicorn waited for
    that body for ever, and the lifespan never closed)."""
    port = free_port()
    env = {
        **os.environ, "OCRVL_BACKENDS": fake.url, "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY, "OCRVL_PREPROCESS_WORKERS": "1",
        "OCRVL_DATA_DIR": str(tmp_path / "data"), "OCRVL_REQUEST_TIMEOUT": "1",
        "OCRVL_LOG_LEVEL": "debug",
    }  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        wait_until_up(f"http://127.0.0.1:{port}/ready", gateway, log, 60)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as held:
            held.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            # uvicorn answers 100 Continue once the route reads the body: the request is in
            assert held.recv(64).startswith(b"HTTP/1.1 100 Continue")
            gateway.send_signal(signal.SIGTERM)
            # uvicorn ends by raising the signal again once it has stopped: it was not killed
            assert gateway.wait(timeout=60) == -signal.SIGTERM  # generous: fails, not hangs
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
    text = log.read_text()
    assert "timeout graceful shutdown exceeded" in text, text[-3000:]
    assert '"shutdown: closed #1 Quotas.close in ' in text, text[-3000:]
    assert "; abandoned: none; failed: none" in text, text[-3000:]
