"""The fidelity tier's parts: the stand-ins, the corpus on disk, a real `ocrvl serve`, PaddleX.

Both pipelines read the same files, get the same layout boxes (by page size) and are answered
by the same kind of stand-in VLM, one per side so that each side's requests can be compared.
Each run (RUNS: documents and options) goes once per session through PaddleX (a call to the
session's PaddleX worker in `.venv-paddleocr`) and through the gateway, a real `ocrvl serve`
with `OCRVL_BACKENDS` at its stand-in VLM and `OCRVL_LAYOUT_URL` at the stand-in layout service.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CLIENT_KEY, VENV_BIN, wait_until_up
from tests.fidelity import pages as corpus_pages
from tests.fidelity.pages import DOCUMENTS, KNOWN_DIFFERENCES, Document
from tests.support import paddlex_pipeline
from tests.support.layout_standin import LayoutStandin
from tests.support.servers import free_port, serving
from tests.support.standin_vlm import Received, StandinVLM

GATEWAY_TIMEOUT = 120.0
Layouts = dict[str, list[dict[str, Any]]]  # a page's boxes by its size, "WxH"


@dataclass(frozen=True)
class Side:
    """What one pipeline made of every document, and what its stand-in VLM was asked."""

    pages: dict[tuple[str, int], dict[str, Any]]  # (document, 0-based page) -> page report
    received: list[Received]


@pytest.fixture(scope="session")
def documents(tmp_path_factory: pytest.TempPathFactory) -> list[Document]:
    """The corpus as files (tests/fidelity/pages.py's DOCUMENTS)."""
    return corpus_pages.write(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def layouts(documents: list[Document]) -> Layouts:
    """Every page's boxes by its size (sizes are unique in the corpus)."""
    boxes = {page.size: page.boxes for doc in documents for page in doc.pages}
    assert len(boxes) == len({page.name for doc in documents for page in doc.pages})
    return boxes


@dataclass(frozen=True)
class Run:
    """Documents read by both sides with the same options (PaddleX's and the gateway's names)."""

    documents: tuple[str, ...]
    predict: dict[str, Any] = field(default_factory=dict)  # PaddleX's predict() arguments
    fields: dict[str, str] = field(default_factory=dict)  # /v1/ocr's form fields


RUNS = {
    "corpus": Run(tuple(name for name, _, _ in DOCUMENTS if name not in KNOWN_DIFFERENCES)),
    "recognizing": Run(
        ("figures", "overlaps"),  # the pages with charts and seals
        {"use_chart_recognition": True, "use_seal_recognition": True},
        {"chart_recognition": "true", "seal_recognition": "true"},
    ),
    "options": Run(
        ("article", "polygons", "overlaps"),
        {
            "layout_shape_mode": "rect",
            "markdown_ignore_labels": ["header", "aside_text"],
            "max_new_tokens": 512,
        },
        {
            "layout_shape_mode": "rect",
            "markdown_ignore_labels": "header,aside_text",
            "max_tokens": "512",
        },
    ),
    **{name: Run((name,)) for name in KNOWN_DIFFERENCES},
}


class PaddleX:
    """PaddleX's PaddleOCR-VL-1.5 pipeline, one worker call (a fresh child) per run, each at a
    stand-in VLM of its own; a run's result is kept for the session."""

    def __init__(self, documents: list[Document], layouts: Layouts, workdir: Path) -> None:
        self.documents = {doc.name: doc for doc in documents}
        self.layouts, self.workdir = layouts, workdir
        self.sides: dict[str, Side | str] = {}

    def side(self, run: str) -> Side:
        """What PaddleX made of `RUNS[run]`."""
        return remembered(self.sides, run, self._run)

    def _run(self, run: str) -> Side:
        chosen = [self.documents[name] for name in RUNS[run].documents]
        workdir = self.workdir / run
        workdir.mkdir()
        with serving(StandinVLM()) as vlm:
            paths, url = [doc.path for doc in chosen], f"{vlm.url}/v1"
            done = paddlex_pipeline.run(
                url, paths, self.layouts, workdir, predict=RUNS[run].predict
            )
        by_path = {str(doc.path): doc.name for doc in chosen}
        pages = {(by_path[p["input_path"]], p["page_index"] or 0): p for p in done.pages}
        return Side(pages, list(vlm.received))


def remembered(sides: dict[str, Side | str], run: str, make: Callable[[str], Side]) -> Side:
    """`sides[run]`, made once; a run that failed fails every later test that asks for it at
    once, with the first failure's message, instead of running again."""
    if run not in sides:
        try:
            sides[run] = make(run)
        except Exception as exc:
            sides[run] = f"{type(exc).__name__}: {exc}"
            raise
    side = sides[run]
    if isinstance(side, str):
        pytest.fail(f"the {run!r} run failed in an earlier test: {side}")
    return side


@pytest.fixture(scope="session")
def paddlex(
    paddlex_python: Path,
    documents: list[Document],
    layouts: Layouts,
    tmp_path_factory: pytest.TempPathFactory,
) -> PaddleX:
    """PaddleX's own pipeline over the corpus's runs."""
    return PaddleX(documents, layouts, tmp_path_factory.mktemp("paddlex"))


@dataclass
class Gateway:
    """A running `ocrvl serve` and the stand-ins behind it."""

    url: str
    vlm: StandinVLM
    layout: LayoutStandin
    documents: dict[str, Document]
    sides: dict[str, Side | str] = field(default_factory=dict)

    def side(self, run: str) -> Side:
        """What the gateway made of `RUNS[run]` (kept for the session)."""
        chosen = [self.documents[name] for name in RUNS[run].documents]
        return remembered(self.sides, run, lambda _: self.read(chosen, **RUNS[run].fields))

    def read(self, documents: list[Document], **fields: str) -> Side:
        """`/v1/ocr` with `layout=on` (and `fields`) for each document, one after the other."""
        start = len(self.vlm.received)
        reports: dict[tuple[str, int], dict[str, Any]] = {}
        with httpx.Client(base_url=self.url, timeout=GATEWAY_TIMEOUT) as client:
            for doc in documents:
                answer = client.post(
                    "/v1/ocr",
                    headers={"authorization": f"Bearer {CLIENT_KEY}"},
                    files={"file": (doc.path.name, doc.path.read_bytes())},
                    data={"layout": "on", **fields},
                )
                assert answer.status_code == 200, f"{doc.name}: {answer.status_code} {answer.text}"
                for index, page in enumerate(answer.json()["pages"]):
                    reports[(doc.name, index)] = page
        return Side(reports, self.vlm.received[start:])

    def read_as_job(self, document: Document) -> Side:
        """The document as a job (`POST /v1/ocr/jobs`, `layout=on`), long-polled to its end."""
        start = len(self.vlm.received)
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        with httpx.Client(base_url=self.url, timeout=GATEWAY_TIMEOUT, headers=headers) as client:
            file = {"file": (document.path.name, document.path.read_bytes())}
            submitted = client.post("/v1/ocr/jobs", files=file, data={"layout": "on"})
            assert submitted.status_code == 202, submitted.text
            location = submitted.headers["location"]
            job = submitted.json()
            for _ in range(10):  # each long poll returns when the status changes
                if job["status"] not in ("queued", "running"):
                    break
                job = client.get(location, params={"wait": 30}).json()
            assert job["status"] == "succeeded", job
            pages = client.get(f"{location}/result").json()["pages"]
        reports = {(document.name, index): page for index, page in enumerate(pages)}
        return Side(reports, self.vlm.received[start:])


@pytest.fixture(scope="session")
def gateway(
    documents: list[Document], layouts: Layouts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A real `ocrvl serve` at a stand-in VLM of its own and the stand-in layout service."""
    workdir = tmp_path_factory.mktemp("gateway")
    with (
        serving(StandinVLM()) as vlm,
        serving(
            LayoutStandin(boxes=lambda width, height, _: layouts[f"{width}x{height}"])
        ) as layout,
        running_gateway(vlm.url, layout.url, workdir) as url,
    ):
        yield Gateway(url, vlm, layout, {doc.name: doc for doc in documents})


@contextlib.contextmanager
def running_gateway(backend: str, layout: str, workdir: Path) -> Iterator[str]:
    """A real `ocrvl serve` at `backend` with the layout service at `layout`; its URL."""
    port = free_port()
    log = workdir / "gateway.log"
    environment = {
        **os.environ,
        "OCRVL_BACKENDS": backend,
        "OCRVL_LAYOUT_URL": layout,
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_HEALTH_INTERVAL": "1",
        "OCRVL_DATA_DIR": str(workdir / "data"),
    }
    command = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/ready", process, log, 30)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
