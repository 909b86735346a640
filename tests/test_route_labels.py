"""The route label of every route, from the gateway's own route table (app/context.py).

`make test` runs this file twice: in the gateway venv (the versions of locks/gateway.txt) and
in a throwaway venv with the newest FastAPI and Starlette (scripts/latest.sh), so a framework
release that would change a label is known before the lock moves to it.
"""

from __future__ import annotations

import json
import logging

import fastapi
import httpx
import pytest
import starlette

from app.context import RouteLabels
from app.logs import JSONFormatter
from app.routes import batches, chat, files, health, jobs, layout_parsing, models, ocr, ui, usage
from tests.support.fake_backend import FakeVLLM
from tests.support.prometheus import LABEL

pytestmark = pytest.mark.anyio
BODY = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}]}
# (method, path) -> (status, label): one line per route the gateway serves, then paths of none
LABELS = {
    ("POST", "/v1/chat/completions"): (200, "/v1/chat/completions"),
    ("POST", "/chat/completions"): (200, "/chat/completions"),
    ("POST", "/v1/ocr"): (400, "/v1/ocr"),
    ("POST", "/v1/ocr/jobs"): (400, "/v1/ocr/jobs"),
    ("GET", "/v1/ocr/jobs"): (200, "/v1/ocr/jobs"),
    ("GET", "/v1/ocr/jobs/job_unknown"): (404, "/v1/ocr/jobs/{job_id}"),
    ("DELETE", "/v1/ocr/jobs/job_unknown"): (404, "/v1/ocr/jobs/{job_id}"),
    ("GET", "/v1/ocr/jobs/job_unknown/result"): (404, "/v1/ocr/jobs/{job_id}/result"),
    ("POST", "/v1/files"): (400, "/v1/files"),
    ("GET", "/v1/files"): (200, "/v1/files"),
    ("GET", "/v1/files/file-unknown"): (404, "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/file-unknown"): (404, "/v1/files/{file_id}"),
    ("GET", "/v1/files/file-unknown/content"): (404, "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"): (400, "/v1/batches"),
    ("GET", "/v1/batches"): (200, "/v1/batches"),
    ("GET", "/v1/batches/batch_unknown"): (404, "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/batch_unknown/cancel"): (404, "/v1/batches/{batch_id}/cancel"),
    ("GET", "/v1/usage"): (200, "/v1/usage"),
    ("POST", "/layout-parsing"): (422, "/layout-parsing"),  # PaddleX's: a body it cannot take
    ("POST", "/restructure-pages"): (422, "/restructure-pages"),
    ("GET", "/ui"): (200, "/ui"),
    ("GET", "/ui/app.js"): (200, "/ui/{name}"),
    ("GET", "/ui/missing.js"): (404, "/ui/{name}"),
    ("GET", "/v1/models"): (200, "/v1/models"),
    ("GET", "/models"): (200, "/models"),
    ("GET", "/openapi.json"): (200, "/openapi.json"),
    ("GET", "/v1/chat/completions"): (405, "/v1/chat/completions"),
    ("GET", "/nowhere"): (404, "unmatched"),
    ("POST", "/v1/chat/completions/more"): (404, "unmatched"),
}
QUIET = {"/health", "/ready", "/metrics"}  # neither counted nor logged


def requests_by_label(metrics_text: str) -> dict[tuple[str, str], float]:
    """ocrvl_requests_total's samples as {(route, status): count}."""
    counts = {}
    for line in metrics_text.splitlines():
        if line.startswith("ocrvl_requests_total{"):
            labels, value = line.split("} ")
            found = dict(LABEL.findall(labels))
            counts[found["route"], found["status"]] = float(value)
    return counts


def test_the_table_names_every_route_the_gateway_declares() -> None:
    """Each path of the gateway's routers (and FastAPI's /openapi.json) is pinned above."""
    routers = (chat.router, ocr.router, jobs.router, usage.router, models.router, health.router)
    routers += (files.router, batches.router, layout_parsing.router)
    declared = {"/openapi.json"} | {
        route.path for router in (*routers, ui.router) for route in router.routes
    }  # fmt: skip
    pinned = {label for _, label in LABELS.values() if label != "unmatched"}
    assert declared == pinned | QUIET


async def test_every_route_is_counted_and_logged_under_its_own_label(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request's status, and its label in ocrvl_requests_total and the access line, are
    the pinned ones; probes and scrapes are in neither."""
    logging.getLogger("ocrvl").propagate = True
    seen = {}
    with caplog.at_level(logging.INFO, logger="ocrvl.access"):
        for method, path in LABELS:
            body = BODY if method == "POST" and "chat" in path else None
            response = await gateway_client.request(method, path, json=body)
            line = json.loads(JSONFormatter().format(caplog.records[-1]))
            seen[method, path] = (response.status_code, line["route"])
        count = len(caplog.records)
        for path in sorted(QUIET):
            await gateway_client.get(path)
        assert len(caplog.records) == count
    versions = f"FastAPI {fastapi.__version__}, Starlette {starlette.__version__}"
    assert seen == LABELS, versions
    counted = requests_by_label((await gateway_client.get("/metrics")).text)
    expected: dict[tuple[str, str], float] = {}
    for status, label in LABELS.values():
        expected[label, str(status)] = expected.get((label, str(status)), 0) + 1
    assert counted == expected, versions


def test_path_templates_and_a_root_path_find_their_route() -> None:
    """`{name}` matches one segment, `{name:path}` the rest; a root path is not part of it."""

    class Declared:
        def __init__(self, path: str) -> None:
            self.path = path

    labels = RouteLabels([Declared("/v1/models/{model}"), Declared("/files/{rest:path}")])
    assert labels({"path": "/v1/models/tiny"}) == "/v1/models/{model}"
    assert labels({"path": "/v1/models/a/b"}) == "unmatched"
    assert labels({"path": "/files/a/b.txt"}) == "/files/{rest:path}"
    assert labels({"path": "/api/v1/models/x", "root_path": "/api"}) == "/v1/models/{model}"
    assert labels({"path": "/v1/models/"}) == "unmatched"
