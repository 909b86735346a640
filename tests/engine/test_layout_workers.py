"""The layout service's worker processes (`--worker-processes`, docs/layout.md), served for real
on the tiny checkpoint: the same answers as the in-process threads on varied pages, the same 400
bodies for bad images, a worker killed by its PID (a fault no real part produces on demand, so
the test makes it) replaced with no request failing, no process outliving the service however it
ends, and workers that never load torch."""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import re
import select
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.test_layout_api import BAD_BODIES, SMALL_PNG, page_url, post
from tests.support.layout_pages import layout_page
from tests.support.layout_service import LayoutService, start_layout_service, tiny_layout_dir
from tests.support.pages import data_url
from tests.support.servers import ignored_signals, lifespan_client

pytestmark = pytest.mark.engine
ADDRESS = re.compile(r"0x[0-9a-f]+")

BAD_IMAGES = {name: (body["images"][0], code) for name, (body, param, code) in BAD_BODIES.items()
              if param == "images.0" and code in ("invalid_image", "image_too_large")}  # fmt: skip


def varied_pages() -> list[str]:
    """Pages of six shapes and five encodings: PNG and JPEG, grey, with alpha, a palette."""
    sizes = ((1240, 1754), (1754, 1240), (640, 1600), (1000, 1000), (700, 440))
    pages = [page_url(i, w, h, "PNG" if i % 2 else "JPEG") for i, (w, h) in enumerate(sizes)]
    for mode in ("L", "RGBA", "P"):
        out = io.BytesIO()
        layout_page(20 + len(pages), 1275, 1650).convert(mode).save(out, format="PNG")
        pages.append(data_url(out.getvalue(), "image/png"))
    return pages


@pytest.fixture(scope="module")
def threads_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The service as before worker processes: decoding and post-processing in its threads."""
    folder = tmp_path_factory.mktemp("layout-threads")
    service = start_layout_service(folder / "layout.log", "--worker-processes", "0")
    yield service.url
    service.stop()


def family(pid: int) -> dict[int, int]:
    """Every descendant of `pid` and its depth (1: a child), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    depth, found, frontier = 1, {}, {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= dict.fromkeys(frontier, depth)
        depth += 1
    return found


def workers_of(service: LayoutService) -> list[int]:
    """The worker processes: forked by the fork server, the service's child."""
    return sorted(pid for pid, depth in family(service.process.pid).items() if depth == 2)


def wait_ended(pids: dict[int, int], seconds: float) -> list[int]:
    """Wait on each pidfd until its process ends; those still running after `seconds`."""
    return [pid for pid, fd in pids.items() if not select.select([fd], [], [], seconds)[0]]


def restarts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("ocrvl_layout_worker_restarts_total"))
    return float(line.split()[-1])


def test_worker_processes_answer_as_the_threads_do(
    layout_service: str, threads_service: str
) -> None:
    """Eight varied pages in one request, alone, and with per-class thresholds and polygon
    outlines: the default service (worker processes) answers exactly what the threads do."""
    pages = varied_pages()
    bodies = [{"images": pages}, {"images": pages[3:4]},
              {"images": pages[:4], "threshold": {"22": 0.35, "17": 0.4},
               "layout_shape_mode": "poly", "layout_merge_bboxes_mode": "large"}]  # fmt: skip
    answers = []
    for body in bodies:
        by_threads = post(threads_service, body)
        by_processes = post(layout_service, body)
        assert by_processes.status_code == by_threads.status_code == 200, by_processes.text
        assert by_processes.json() == by_threads.json()
        answers.append(by_threads.json()["results"])
    assert sum(len(result["boxes"]) for result in answers[0]) >= 10, "boxes to compare"
    assert any("polygon_points" in box for result in answers[2] for box in result["boxes"])


@pytest.mark.parametrize("name", list(BAD_IMAGES))
def test_a_bad_image_is_the_same_400_from_a_worker_process(
    layout_service: str, threads_service: str, name: str
) -> None:
    """A bad image second of three: the same status and body (message, param images.1, code)
    whether a thread or a worker process decoded it (but for the address of Pillow's buffer,
    which its message names and which differs from one call to the next)."""
    image, code = BAD_IMAGES[name]
    body = {"images": [data_url(SMALL_PNG, "image/png"), image, data_url(SMALL_PNG, "image/png")]}
    by_threads, by_processes = post(threads_service, body), post(layout_service, body)
    assert by_processes.status_code == by_threads.status_code == 400
    assert ADDRESS.sub("0x?", by_processes.text) == ADDRESS.sub("0x?", by_threads.text)
    assert (by_processes.json()["error"]["param"], by_processes.json()["error"]["code"]) == (
        "images.1", code)  # fmt: skip


def test_an_invalid_request_crosses_the_process_boundary_whole() -> None:
    """InvalidRequest pickles with its message, param and code (a worker's raise is the
    handler's 400)."""
    from ocrvl_layout.errors import InvalidRequest  # noqa: PLC0415

    sent = InvalidRequest("images[3] is not an image", param="images.3", code="invalid_image")
    got = pickle.loads(pickle.dumps(sent))  # noqa: S301 (our own object)
    assert type(got) is InvalidRequest
    assert (got.message, got.param, got.code, got.status) == (
        sent.message, "images.3", "invalid_image", 400)  # fmt: skip


async def all_at_once(url: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=180) as client:
        sent = (client.post(f"{url}/v1/layout", json=body) for body in bodies)
        return list(await asyncio.gather(*sent))


def test_pages_wait_for_a_free_slot_and_every_slot_comes_back(tmp_path: Path) -> None:
    """--max-batch 1 and one worker process: four page slots (slots.py, logged). Ten pages in
    one request wait for free slots and each is answered as it is alone (every pass one page,
    so the same arithmetic); a bad image among good ones is its 400 and keeps no slot; then
    three requests of ten at once are all answered (a slot kept, or a request holding some
    slots while it waits for more, would leave them waiting until the client's timeout)."""
    service = start_layout_service(
        tmp_path / "layout.log", "--max-batch", "1", "--worker-processes", "1"
    )
    try:
        assert "4 page slots of 800x800 shared with the workers" in service.log_path.read_text()
        body = {"images": (varied_pages() * 2)[:10]}
        alone = [post(service.url, {"images": [page]}).json()["results"] for page in body["images"]]
        want = {"results": [results[0] for results in alone]}
        assert post(service.url, body).json() == want
        bad_image = next(iter(BAD_IMAGES.values()))[0]
        bad = post(service.url, {"images": [*body["images"][:5], bad_image, *body["images"][5:]]})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "images.5")
        for answer in asyncio.run(all_at_once(service.url, [body] * 3)):
            assert answer.status_code == 200, answer.text
            assert answer.json() == want
    finally:
        service.stop()


def test_where_workers_cannot_map_the_slots_pages_come_back_pickled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process, the slots' descriptor made one no worker can open (a fake of a system that
    hides /proc's descriptors, which this machine does not): the service logs that pages come
    back pickled and answers as a service whose workers map them does."""
    import dataclasses  # noqa: PLC0415

    from ocrvl_layout.api import create_app  # noqa: PLC0415
    from ocrvl_layout.settings import Settings  # noqa: PLC0415
    from ocrvl_layout.slots import PageSlots  # noqa: PLC0415

    made = PageSlots.__init__

    def unreachable(self: PageSlots, *args: Any) -> None:
        made(self, *args)
        self.address = dataclasses.replace(self.address, fd=10**6)

    body = {"images": varied_pages()[:3]}

    async def answer() -> Any:
        ready = asyncio.Event()
        app = create_app(settings, on_ready=lambda _: ready.set())
        async with lifespan_client(app) as client:
            await asyncio.wait_for(ready.wait(), timeout=120)
            response = await client.post("/v1/layout", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()

    settings = Settings(model=str(tiny_layout_dir()), device="cpu", worker_processes=1)
    with caplog.at_level("INFO", logger="ocrvl_layout"):
        shared = asyncio.run(answer())
        assert "page slots of 800x800 shared" in caplog.text
        monkeypatch.setattr(PageSlots, "__init__", unreachable)
        caplog.clear()
        pickled = asyncio.run(answer())
    assert "cannot map the page slots" in caplog.text
    assert "shared with the workers" not in caplog.text
    assert pickled == shared


def test_a_killed_worker_is_replaced_and_the_next_request_succeeds(tmp_path: Path) -> None:
    """SIGKILL to one worker by its PID: the next request is answered 200 with the boxes it got
    before, the pool is replaced (the restarts counter says 1), the dead PID is no worker."""
    service = start_layout_service(tmp_path / "layout.log", "--worker-processes", "2")
    try:
        body = {"images": varied_pages()[:3]}
        before = post(service.url, body)
        assert before.status_code == 200, before.text
        workers = workers_of(service)
        assert len(workers) == 2, workers
        for pid in workers:  # no torch in a worker: its memory maps no libtorch
            assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()
        victim = workers[0]
        fd = os.pidfd_open(victim)
        os.kill(victim, signal.SIGKILL)
        assert not wait_ended({victim: fd}, 60)
        os.close(fd)
        after = post(service.url, body)
        assert after.status_code == 200, after.text
        assert after.json() == before.json()
        assert restarts(service.url) == 1
        assert victim not in workers_of(service)
    finally:
        service.stop()


def test_workers_and_their_fork_server_leave_sigint_and_sigterm_to_the_service(
    tmp_path: Path,
) -> None:
    """A signal to the whole process group (Ctrl-C, `kill -TERM -- -PGID`, as make serve and
    the GPU bench stop it) ends the service, which shuts its pool down. A worker, or the fork
    server that reports the workers' ends, ended by it first broke the pool under requests still
    in flight and had it replaced for nothing (seen on the H200 and on the CPU: "a worker process
    died" at every stop). Here SIGTERM reaches every process the service started before it
    (the order a group's stop may take): each ignores it, the next request is answered by the
    same pool, and the service's own SIGTERM then ends them all."""
    service = start_layout_service(tmp_path / "layout.log", "--worker-processes", "2")
    try:
        workers = workers_of(service)
        assert len(workers) == 2
        started = family(service.process.pid)
        server = [pid for pid, depth in started.items() if depth == 1 and pid in
                  {parent_of(worker) for worker in workers}]  # fmt: skip
        assert len(server) == 1, started
        for pid in [*workers, *server]:
            assert {signal.SIGINT, signal.SIGTERM} <= ignored_signals(pid), pid
        for pid in started:
            os.kill(pid, signal.SIGTERM)
        answer = post(service.url, {"images": varied_pages()[:2]})
        assert answer.status_code == 200, answer.text
        assert restarts(service.url) == 0
        assert workers_of(service) == workers
        fds = {pid: os.pidfd_open(pid) for pid in started}
        service.process.send_signal(signal.SIGTERM)
        service.process.wait(timeout=60)
        assert wait_ended(fds, 60) == []
    finally:
        service.stop()  # the log is whole once it returns
    log = service.log_path.read_text()
    assert "Application shutdown complete" in log
    assert "died" not in log


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_process_outlives_the_service(tmp_path: Path, how: signal.Signals) -> None:
    """The service stopped (SIGTERM: it shuts its pool down) or killed (SIGKILL: the fork server
    ends and each worker's parent-death signal kills it): every process it started ends."""
    service = start_layout_service(tmp_path / "layout.log", "--worker-processes", "2")
    try:
        assert post(service.url, {"images": varied_pages()[:2]}).status_code == 200
        assert len(workers_of(service)) == 2
        descendants = {pid: os.pidfd_open(pid) for pid in family(service.process.pid)}
        service.process.send_signal(how)
        service.process.wait(timeout=60)
        outlived = wait_ended(descendants, 60)
        for pid in outlived:  # the test's own, ended so that its output pipe closes
            os.kill(pid, signal.SIGKILL)
        assert outlived == [], "processes outlived the service"
        for fd in descendants.values():
            os.close(fd)
    finally:
        service.stop()
