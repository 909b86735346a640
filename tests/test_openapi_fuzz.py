"""Schemathesis over every route of `/openapi.json`, against a real `ocrvl serve` (FakeVLLM
stands in for the engine; everything on loopback): no answer is a 5xx, and every answer's
status, content type and JSON body are ones the document describes.

Bounded for CI: 30 generated requests per operation (24 operations, PaddleX's two among them:
~720 requests) and 30 stateful scenarios of up to 6 steps following the document's links (a file
→ its batch → the batch again or cancelled; a job → its status, result, cancel). About a minute
on CI's 2 cores.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.openapi import ROUTES
from tests.conftest import BACKEND_KEY, CLIENT_KEY, VENV_BIN, wait_until_up
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import free_port, serving

EXAMPLES = 30  # generated requests per operation
SCENARIOS, STEPS = 30, 6  # stateful runs, and steps in each
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
# Nothing beyond the document: no 5xx, declared statuses and content types, bodies that match
# their schemas
CHECKS = [
    not_a_server_error, status_code_conformance, content_type_conformance,
    response_schema_conformance,
]  # fmt: skip
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `ocrvl serve` in front of FakeVLLM, with small caps so fuzzed uploads stay small."""
    folder = tmp_path_factory.mktemp("fuzz")
    with serving(FakeVLLM()) as fake:
        port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")},
            "OCRVL_BACKENDS": fake.url, "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
            "OCRVL_API_KEYS": CLIENT_KEY, "OCRVL_PREPROCESS_WORKERS": "1",
            "OCRVL_DATA_DIR": str(folder / "data"), "OCRVL_JOB_MAX_ACTIVE": "1000",
            "OCRVL_MAX_FILE_BYTES": "1048576", "OCRVL_BATCH_MAX_FILE_BYTES": "1048576",
        }  # fmt: skip
        log = folder / "gateway.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(f"{url}/ready", process, log, 30)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)
            text = log.read_text(errors="replace")
            assert "Traceback" not in text, text[-4000:]  # no unhandled exception behind a 4xx


@pytest.fixture(scope="module")
def api(gateway_url: str) -> Any:
    """The gateway's own document, loaded as a client would."""
    return schemathesis.openapi.from_url(f"{gateway_url}/openapi.json")


def test_the_document_describes_every_route(gateway_url: str) -> None:
    """Each route has its operation, every POST its request body, every answer its error
    shape; the list routes' query parameters are there."""
    spec = httpx.get(f"{gateway_url}/openapi.json").json()
    operations = {(m, p): op for p, ops in spec["paths"].items() for m, op in ops.items()}
    described = {*ROUTES, ("post", "/chat/completions")}
    assert set(operations) == described, "describe each new route in app/openapi.py's ROUTES"
    for (method, path), operation in operations.items():
        assert operation["operationId"]
        assert "400" in operation["responses"], path
        if method == "post" and "{" not in path:
            assert operation["requestBody"]["content"], path
    assert [p["name"] for p in operations["get", "/v1/ocr/jobs"]["parameters"]] == [
        "limit", "after"
    ]  # fmt: skip


OPERATIONS = [*sorted(ROUTES), ("post", "/chat/completions")]


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_operation_answers_within_the_document(api: Any, method: str, path: str) -> None:
    """Generated requests (valid and not) to each operation: never a 5xx, never an answer the
    document does not describe."""

    @FUZZ
    @given(case=api[path][method.upper()].as_strategy())
    def fuzzed(case: Any) -> None:
        case.call_and_validate(headers=AUTH, checks=CHECKS, timeout=30)

    fuzzed()


def test_chained_calls_stay_within_the_document(api: Any) -> None:
    """Stateful runs along the document's links (file → batch → batch again or cancel; job →
    status, result, cancel): the same checks at every step, and the links are followed."""
    seen: set[tuple[str, str, int]] = set()

    class Workflow(api.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            # A generated Idempotency-Key that comes again makes a step's answer depend on an
            # earlier scenario's (that first answer, or a 422 for another body), so the same
            # steps can find other ids to follow, which Hypothesis fails as a flaky strategy
            # (a CI run did). Each operation above fuzzes the header; test_idempotency tests it.
            if case.headers:
                case.headers.pop("Idempotency-Key", None)
            return {"headers": AUTH, "timeout": 30}

        def after_call(self, response: Any, case: Any) -> None:
            super().after_call(response, case)
            seen.add((case.method, case.path, response.status_code))

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Workflow.run(
        settings=settings(
            max_examples=SCENARIOS, stateful_step_count=STEPS, deadline=None,
            derandomize=True, database=None, suppress_health_check=list(HealthCheck),
        )
    )  # fmt: skip
    # a 200 on an id's path can only come from an id an earlier answer gave (a made-up one is
    # a 404): links were followed, on more than one chain
    followed = {path for _, path, status in seen if status == 200 and "{" in path}
    assert len(followed) >= 2, sorted(seen)


def test_wrong_json_types_on_one_connection_leave_it_serving(gateway_url: str) -> None:
    """Lists and objects where strings belong, one after another on one pooled keep-alive
    connection: every answer a 400, and the next good request on it is answered (before, the
    500's exception broke requests beside it with transport errors)."""
    bad = [{"completion_window": []}, {"completion_window": {}}, {"endpoint": []}, {"metadata": []}]
    with httpx.Client(base_url=gateway_url, headers=AUTH, timeout=30) as client:
        for body in bad * 5:
            answer = client.post("/v1/batches", json={"input_file_id": "file-x", **body})
            assert answer.status_code == 400, answer.text
        assert client.get("/v1/batches").status_code == 200
