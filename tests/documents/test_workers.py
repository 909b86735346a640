"""The preprocessing pool: its size, surviving a worker that dies (its tasks tried again), workers
out of the gateway's process group, workers that do not outlive a gateway killed outright, and
the laid-out pages' pixels it holds between worker calls (counted, deleted)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.documents import crops, raster
from app.documents.errors import DocumentError
from app.documents.sniff import PDF
from app.documents.workers import ATTEMPTS, CLOSE_GRACE, Preprocessor
from app.settings import Settings
from tests.conftest import BACKEND_KEY, CLIENT_KEY, VENV_BIN, settings_for, wait_until_up
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import free_port, wait_gone

pytestmark = pytest.mark.anyio


def test_default_workers_are_cores_minus_one_and_at_least_one() -> None:
    """OCRVL_PREPROCESS_WORKERS defaults to the usable cores - 1, never 0."""
    cores = len(os.sched_getaffinity(0))
    assert settings_for("http://127.0.0.1:9").preprocess_workers == max(cores - 1, 1)


def test_workers_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable sets the pool size; 0 is refused at start-up."""
    monkeypatch.setenv("OCRVL_BACKENDS", "http://127.0.0.1:9")
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_PREPROCESS_WORKERS", "3")
    assert Settings().preprocess_workers == 3
    monkeypatch.setenv("OCRVL_PREPROCESS_WORKERS", "0")
    with pytest.raises(ValueError, match="greater than 0"):
        Settings()


def die_once(marker: str, value: int) -> int:
    """`value`, from a worker that a SIGTERM ends the first time (`marker` not there yet): a
    worker killed under its task, as a stop signal to the gateway's group used to."""
    if not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGTERM)
    return value


async def test_a_task_whose_worker_dies_is_tried_again_on_a_fresh_pool(tmp_path: Path) -> None:
    """A worker killed under its task breaks the pool: the task runs again on a fresh pool and
    answers (before: a 400 preprocess_failed, "the file may be malformed", on a good file)."""
    pool = Preprocessor(1)
    try:
        assert await pool.run(die_once, str(tmp_path / "died"), 42) == 42
        assert (tmp_path / "died").exists()
    finally:
        pool.close()


async def test_a_task_that_kills_its_worker_every_time_fails_as_preprocess_failed() -> None:
    """A task whose worker dies on each of its tries (a file that crashes the decoder) is a
    400 preprocess_failed saying so; the next task runs in a fresh pool."""
    pool = Preprocessor(1)
    try:
        with pytest.raises(DocumentError) as caught:
            await pool.run(os._exit, 1)
        assert caught.value.code == "preprocess_failed"
        assert f"on each of {ATTEMPTS} tries" in str(caught.value)
        assert await pool.run(int, "42") == 42
    finally:
        pool.close()


async def test_workers_are_out_of_the_gateway_s_process_group() -> None:
    """Each worker leads a session of its own: a SIGTERM or Ctrl-C sent to the gateway's
    process group (a service manager, make serve, a terminal) never reaches it while the
    gateway drains."""
    pool = Preprocessor(1)
    try:
        worker = await pool.run(os.getpid)
        assert await pool.run(os.getsid, 0) == worker
        assert await pool.run(os.getpgid, 0) != os.getpgrp()
    finally:
        pool.close()


async def test_workers_run_behind_the_event_loop() -> None:
    """Workers run at a lower CPU priority than the gateway process."""
    pool = Preprocessor(1)
    try:
        assert await pool.run(os.nice, 0) == os.nice(0) + 10
    finally:
        pool.close()


def never_ends(address: str) -> None:
    """A fake page that never ends (a render stuck for ever): it connects to `address`, saying
    it began, then waits for a byte that never comes."""
    with socket.socket(socket.AF_UNIX) as line:
        line.connect(address)
        line.recv(1)


@contextlib.asynccontextmanager
async def stuck_page(
    pool: Preprocessor, folder: Path
) -> AsyncIterator[tuple[asyncio.Future[Any], socket.socket, int]]:
    """A page that never ends running in `pool`: its future, the line its worker holds, and
    that worker's pid."""
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "page"))
        listener.listen()
        listener.setblocking(False)
        page = asyncio.ensure_future(pool.run(never_ends, str(folder / "page")))
        line, _ = await asyncio.get_running_loop().sock_accept(listener)
        with line:
            credentials = line.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            yield page, line, struct.unpack("3i", credentials)[0]


async def test_close_kills_a_worker_still_on_a_page_that_never_ends(tmp_path: Path) -> None:
    """A worker still on a page when the pool closes (its request gone, the page never ending)
    is killed after CLOSE_GRACE and close returns (before: shutdown(wait=True) waited for the
    page, for ever, and the gateway's stop with it)."""
    pool = Preprocessor(1)
    async with stuck_page(pool, tmp_path) as (page, line, pid):
        page.cancel()  # the request is gone; its worker is not
        with contextlib.suppress(asyncio.CancelledError):
            await page
        closing = asyncio.ensure_future(asyncio.to_thread(pool.close))
        # the worker is gone (its end of the line closed), and close returns; the bounds are
        # generous, to fail rather than hang on a close that waits for the page
        received = asyncio.get_running_loop().sock_recv(line, 1)
        assert await asyncio.wait_for(received, CLOSE_GRACE + 60) == b""
        await asyncio.wait_for(closing, CLOSE_GRACE + 60)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


async def test_a_page_still_awaited_when_its_worker_is_killed_by_close_is_not_retried(
    tmp_path: Path,
) -> None:
    """A page still awaited when close kills its worker fails (BrokenProcessPool) instead of
    being tried again on a fresh pool that nothing would ever close, its page stuck again."""
    pool = Preprocessor(1)
    async with stuck_page(pool, tmp_path) as (page, _, _):
        await asyncio.to_thread(pool.close)
        with pytest.raises(BrokenProcessPool):
            await asyncio.wait_for(page, 60)  # generous: a retried page never ends


def descendants(root: int) -> dict[int, str]:
    """Every live process under `root` (by /proc's parent links): pid → command line."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
        commands[int(entry.name)] = command
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = commands[pid]
                frontier.append(pid)
    return found


def test_kill_9_of_the_gateway_leaves_no_worker_behind(fake: FakeVLLM, tmp_path: Path) -> None:
    """A real `ocrvl serve` whose workers have started is killed with SIGKILL (no shutdown
    runs): its preprocessing workers and multiprocessing's resource tracker exit too, within
    seconds (before: both ran on for ever, re-parented to PID 1)."""
    port = free_port()
    env = {
        **os.environ, "OCRVL_BACKENDS": fake.url, "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY, "OCRVL_PREPROCESS_WORKERS": "2",
        "OCRVL_DATA_DIR": str(tmp_path / "data"),
    }  # fmt: skip
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    children: dict[int, str] = {}
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/ready", gateway, log, 30)
        answer = httpx.post(
            f"{url}/v1/ocr", files={"file": ("doc.pdf", pdf(2))},
            headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=60,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        children = descendants(gateway.pid)
        commands = " ".join(children.values())
        assert "resource_tracker" in commands, children
        assert commands.count("multiprocessing.spawn") >= 1, children
        gateway.kill()
        gateway.wait()
        left = wait_gone(list(children), timeout=20)
        assert left == [], {pid: children[pid] for pid in left}
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
        for pid in wait_gone(list(children), timeout=0):  # none, unless it failed: by pid
            os.kill(pid, signal.SIGKILL)


def a_page(tmp_path: Path) -> raster.Source:
    """A one-page PDF (1,240 x 1,754 px at 144 dpi: 6.5 MB of pixels)."""
    path = tmp_path / "doc.pdf"
    path.write_bytes(pdf(1))
    return raster.Source(str(path), PDF, 144, 112_896, 1_003_520, 60_000_000)


async def test_held_pixels_are_the_pages_own_counted_until_their_owner_lets_them_go(
    tmp_path: Path,
) -> None:
    """A laid-out page's pixels, kept by the worker that rendered it: the very pixels
    `page_image` renders, counted while held, owned by one holder at a time; the file and the
    count go when the last owner closes them (pixels whose file has gone render the page
    again), the folder with the pool."""
    source = a_page(tmp_path)
    pool = Preprocessor(1)
    try:
        page, held = await pool.keeping(crops.layout_page, source, 0, False)
        with held.take() as mine:
            assert (held.pixels, mine.pixels) == (None, mine.pixels)
            held.close()  # taken: no longer its to let go
            pixels = mine.pixels
            assert pixels is not None
            assert (pixels.width, pixels.height) == (page.width, page.height) == (1240, 1754)
            assert pool.held == pixels.size == 1240 * 1754 * 3
            assert os.listdir(pool.folder) == [os.path.basename(pixels.path)]
            assert pixels.image(source, 0).tobytes() == raster.page_image(source, 0).tobytes()
        assert (pool.held, os.listdir(pool.folder)) == (0, [])
        rendered = raster.page_image(source, 0).tobytes()
        assert pixels.image(source, 0).tobytes() == rendered  # its file gone: rendered again
    finally:
        pool.close()
    with pytest.raises(FileNotFoundError):
        os.listdir(pool.folder)


async def test_pixels_past_the_held_bytes_are_not_kept(tmp_path: Path) -> None:
    """A page whose pixels would take the held count past OCRVL_PREPROCESS_HELD_BYTES keeps
    none (its layout page is made all the same)."""
    pool = Preprocessor(1, held_bytes=1240 * 1754 * 3 - 1)
    try:
        page, held = await pool.keeping(crops.layout_page, a_page(tmp_path), 0, False)
        assert page.url.startswith("data:image/jpeg;base64,")
        assert (held.pixels, pool.held, os.listdir(pool.folder)) == (None, 0, [])
    finally:
        pool.close()


async def test_pixels_kept_for_a_reading_cancelled_meanwhile_are_deleted(tmp_path: Path) -> None:
    """A page cancelled (its client gone) while its worker renders it: what the worker keeps
    for nobody is deleted once it has finished."""
    pool = Preprocessor(1)
    try:
        reading = asyncio.create_task(pool.keeping(crops.layout_page, a_page(tmp_path), 0, False))
        await asyncio.sleep(0)  # one step: its worker call is under way
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        worker_call = [
            task
            for task in asyncio.all_tasks()
            if task.get_coro().__qualname__ == "Preprocessor.run"
        ]
        assert len(worker_call) == 1
        await asyncio.wait(worker_call)  # its done callbacks, the deletion first, have run
        assert (pool.held, os.listdir(pool.folder)) == (0, [])
    finally:
        pool.close()
