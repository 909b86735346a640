"""The layout service's life: settings it refuses, a checkpoint it cannot load, readiness
that waits for the warm-up (503 `not_ready` with Retry-After until then), and a client that
leaves before its body is whole."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.layout_service import ENGINE_VENV, ROOT, start_layout_service, tiny_layout_dir
from tests.support.servers import lifespan_client
from tests.support.tiny_layout import CONFIG_LABELS, LABELS

pytestmark = pytest.mark.engine

PYTHON = str(ENGINE_VENV / "bin" / "python")


def test_without_a_model_the_command_says_how_to_name_one() -> None:
    """No --model and no OCRVL_LAYOUT_MODEL: exit 2 and a message naming both."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_LAYOUT_")}
    done = subprocess.run(
        [PYTHON, "-m", "ocrvl_layout"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "--model" in done.stderr
    assert "OCRVL_LAYOUT_MODEL" in done.stderr


def test_a_folder_that_is_no_checkpoint_ends_the_process(tmp_path: Path) -> None:
    """A model folder without a checkpoint: the service says why and exits 1 (it never reports
    ready), so a supervisor sees the failure."""
    done = subprocess.run(
        [PYTHON, "-m", "ocrvl_layout", "--model", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "has no config.json" in output
    assert "ready on" not in output


def test_ready_waits_for_the_warm_up_and_layout_requests_wait_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process, the warm-up held back on an event: /health 200, /ready and /v1/layout 503
    `not_ready` with Retry-After; once the warm-up runs, /ready is 200 and pages are served."""
    from ocrvl_layout.api import create_app  # noqa: PLC0415
    from ocrvl_layout.model import LayoutModel  # noqa: PLC0415
    from ocrvl_layout.settings import Settings  # noqa: PLC0415

    release = threading.Event()
    warm_up = LayoutModel.warm_up

    def held_warm_up(self: LayoutModel, *args: Any) -> float:
        release.wait(timeout=120)
        return warm_up(self, *args)

    monkeypatch.setattr(LayoutModel, "warm_up", held_warm_up)

    async def scenario() -> None:
        ready = asyncio.Event()
        app = create_app(
            Settings(model=str(tiny_layout_dir()), device="cpu"), on_ready=lambda _: ready.set()
        )
        async with lifespan_client(app) as client:
            assert (await client.get("/health")).status_code == 200
            for response in (
                await client.get("/ready"),
                await client.post("/v1/layout", json={"images": ["x"]}),
            ):
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "not_ready"
                assert int(response.headers["retry-after"]) >= 1
            release.set()
            await asyncio.wait_for(ready.wait(), timeout=120)
            assert (await client.get("/ready")).status_code == 200
            metrics = (await client.get("/metrics")).text
            assert 'ocrvl_layout_requests_total{outcome="not_ready"} 1.0' in metrics

    try:
        asyncio.run(scenario())
    finally:
        release.set()


@pytest.mark.parametrize(("compiled", "expected"), [(False, [1]), (True, [1, 4, 2, 3])])
def test_a_compiled_service_warms_every_batch_size_before_it_is_ready(
    monkeypatch: pytest.MonkeyPatch, compiled: bool, expected: list[int]
) -> None:
    """With --compile the warm-up runs every batch size up to --max-batch (1 and the largest
    first) through the model before /ready says 200, so no batch size is first met under load
    (the H200's thirteenth pass: a first batch of 2 stalled every request 130 s); eager warms one
    page. torch.compile is replaced by the identity here (a fake: what is tested is which
    batches run before ready, not torch's compiler, which takes minutes on this CPU)."""
    import torch  # noqa: PLC0415
    from ocrvl_layout.api import create_app  # noqa: PLC0415
    from ocrvl_layout.model import LayoutModel  # noqa: PLC0415
    from ocrvl_layout.settings import Settings  # noqa: PLC0415

    compiled_models: list[object] = []

    def identity(model: Any) -> Any:
        compiled_models.append(model)
        return model

    monkeypatch.setattr(torch, "compile", identity)
    batches: list[int] = []
    detect = LayoutModel.detect

    def counted(self: LayoutModel, pages: list[Any]) -> Any:
        batches.append(len(pages))
        return detect(self, pages)

    monkeypatch.setattr(LayoutModel, "detect", counted)

    async def scenario() -> None:
        ready = asyncio.Event()
        settings = Settings(
            model=str(tiny_layout_dir()), device="cpu", max_batch=4, compile=compiled
        )
        app = create_app(settings, on_ready=lambda _: ready.set())
        async with lifespan_client(app):
            await asyncio.wait_for(ready.wait(), timeout=120)
            assert batches == expected
            assert len(compiled_models) == (1 if compiled else 0)

    asyncio.run(scenario())


def test_label_names_come_from_inference_yml_as_paddlex_reads_them(tmp_path: Path) -> None:
    """inference.yml's label_list names the classes (display_formula, not config.json's
    repeated `formula`); without it an id2label of repeated names reads as PaddleX's list, and
    distinct names as they are; a label_list of another length is refused."""
    from ocrvl_layout.model import CheckpointError, labels_of  # noqa: PLC0415

    assert labels_of(tiny_layout_dir(), list(CONFIG_LABELS)) == list(LABELS)
    assert labels_of(tmp_path, list(CONFIG_LABELS)) == list(LABELS)  # no inference.yml here
    own = [f"kind_{i}" for i in range(25)]
    assert labels_of(tmp_path, own) == own
    (tmp_path / "inference.yml").write_text("label_list: [text, title]\n")
    with pytest.raises(CheckpointError, match="names 2 labels"):
        labels_of(tmp_path, own)


def test_a_client_that_leaves_mid_body_is_counted_and_not_logged_as_an_error(
    tmp_path: Path,
) -> None:
    """A real socket sends a request's head and part of its body, then closes (a load client
    stopping, a gateway whose request was cancelled): the service counts it `closed`, logs no
    error, and serves on (on an H100 each such request logged "unexpected error" and a
    traceback, and counted `error`)."""
    service = start_layout_service(tmp_path / "layout.log")
    try:
        address = urlsplit(service.url)
        head = (b"POST /v1/layout HTTP/1.1\r\nHost: layout\r\nContent-Type: application/json"
                b"\r\nContent-Length: 100000\r\n\r\n")  # fmt: skip
        with socket.create_connection((address.hostname, address.port)) as raw:
            raw.sendall(head + b'{"images": ["data:image/png;base64,' + b"A" * 1000)
        counted = 'ocrvl_layout_requests_total{outcome="closed"} 1.0'
        deadline, metrics = time.monotonic() + 60, ""
        while counted not in metrics and time.monotonic() < deadline:
            metrics = httpx.get(f"{service.url}/metrics", timeout=10).text
            time.sleep(0.1)
        still = httpx.get(f"{service.url}/ready", timeout=10).status_code
    finally:
        service.stop()  # every handler done and its log lines read before the checks below
    log = (tmp_path / "layout.log").read_text()
    assert counted in metrics
    assert 'ocrvl_layout_requests_total{outcome="error"} 0.0' in metrics
    assert still == 200
    assert "unexpected error" not in log
    assert "Exception in ASGI application" not in log
