"""One error vocabulary: every route's 400s carry a code (never null), and the same mistake gets
the same code and words on every route that takes it (chat, /v1/ocr, jobs).

FakeVLLM stands in for the engine (what it serves, its max_model_len 4096).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client

pytestmark = pytest.mark.anyio
CHAT = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}]}
FILE = {"file": ("doc.pdf", pdf(1))}
JOB_ID = "job_AAAAAAAAAAAAAAAAAAAAAA"

# (method, path, request options): each one a 400 the gateway answers itself
BAD: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/chat/completions", {"content": b"{not json"}),
    ("POST", "/v1/chat/completions", {"json": []}),
    ("POST", "/v1/chat/completions", {"json": {"messages": CHAT["messages"]}}),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "stream": "yes"}}),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "max_tokens": 0}}),
    ("POST", "/v1/chat/completions", {"json": {**CHAT, "cache_salt": "x"}}),
    ("POST", "/v1/ocr", {"data": {"task": "ocr"}, "files": {"x": ("a", b"")}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"dpi": "5"}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"dpi": "many"}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"task": "poem"}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"pages": "0-"}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"max_tokens": "0"}}),
    ("POST", "/v1/ocr", {"files": FILE, "data": {"stream": "maybe"}}),
    ("POST", "/v1/ocr", {"json": {"file": "@@@"}}),
    ("POST", "/v1/ocr", {"json": {"task": "ocr"}}),
    ("POST", "/v1/ocr", {"json": {"file": "", "dpi": []}}),
    ("POST", "/v1/ocr", {"json": {"file": "aGk=", "dpi": {}}}),
    ("POST", "/v1/ocr", {"json": {"file": "aGk=", "task": ["ocr"]}}),
    ("POST", "/v1/ocr", {"json": {"file": "aGk=", "max_tokens": [1]}}),
    ("POST", "/v1/ocr", {"content": b"x", "headers": {"content-type": "text/plain"}}),
    ("POST", "/v1/ocr/jobs", {"data": {"task": "ocr"}, "files": {"x": ("a", b"")}}),
    ("POST", "/v1/ocr/jobs", {"files": FILE, "data": {"max_tokens": "0"}}),
    ("POST", "/v1/ocr/jobs", {"json": {"file": "aGk=", "callback_url": ["x"]}}),
    ("GET", f"/v1/ocr/jobs/{JOB_ID}?wait=x", {}),
    ("GET", "/v1/ocr/jobs?limit=0", {}),
    ("GET", f"/v1/ocr/jobs?after={JOB_ID}", {}),
    ("POST", "/v1/files", {"json": {"purpose": "batch"}}),
    ("POST", "/v1/files", {"files": {"file": ("a.jsonl", b"{}")}, "data": {"purpose": "x"}}),
    ("GET", "/v1/files?limit=x", {}),
    ("GET", "/v1/files?after=file-x", {}),
    ("POST", "/v1/batches", {"content": b"[1"}),
    ("POST", "/v1/batches", {"json": {"completion_window": []}}),
    ("GET", "/v1/batches?limit=1000", {}),
    ("GET", "/v1/usage?start=yesterday", {}),
]


@pytest.fixture
async def client(fake: FakeVLLM, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`."""
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path)
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(create_app(settings), headers=auth, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "options"), BAD)
async def test_every_400_has_a_code(
    client: httpx.AsyncClient, method: str, path: str, options: dict[str, Any]
) -> None:
    """A 400 in OpenAI's shape whose `code` is a non-empty string (and never a 500)."""
    answer = await client.request(method, path, **options)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["code"], str)
    assert error["code"]
    assert error["message"]


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        (0, "integer_below_min_value", "`max_tokens` is 0; it must be at least 1"),
        (99_999, "integer_above_max_value", "`max_tokens` is 99999; this gateway allows at most "
         "4096 (the served model's max_model_len)"),
        (2.5, "invalid_type", "`max_tokens` must be an integer; got 2.5"),
    ],
)  # fmt: skip
async def test_max_tokens_is_judged_alike_everywhere(
    client: httpx.AsyncClient, value: Any, code: str, words: str
) -> None:
    """`max_tokens` out of bounds: one code and one message on chat, /v1/ocr and jobs (a form
    field's digits are the number they spell)."""
    answers = [
        await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": value}),
        await client.post("/v1/ocr", files=FILE, data={"max_tokens": str(value)}),
        await client.post("/v1/ocr/jobs", files=FILE, data={"max_tokens": str(value)}),
        await client.post("/v1/ocr", json={"file": "aGk=", "max_tokens": value}),
    ]
    errors = [answer.json()["error"] for answer in answers]
    assert [answer.status_code for answer in answers] == [400] * 4, errors
    if isinstance(value, float):  # a form field says "2.5": a string, not a float
        errors = [errors[0], errors[3]]
    assert {(e["code"], e["param"], e["message"]) for e in errors} == {(code, "max_tokens", words)}
