"""One validation for the document routes' fields and files: an unknown field is refused as chat
refuses one, a PDF with no pages is `empty_pdf` whatever the worker read before, and a `file`
that is not a file says what it is instead.

FakeVLLM stands in for the engine (it records what reached it: nothing, for a refused request).
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pypdf import PdfWriter

from app.documents import upload
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import encrypted_pdf, pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import ThreadedServer, lifespan_client

pytestmark = pytest.mark.anyio
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
PAGE = pdf(1)
OCRVL = str(Path(sys.executable).parent / "ocrvl")


def no_pages() -> bytes:
    """A well-formed PDF whose page tree is empty (pypdf's writer with no page added)."""
    out = io.BytesIO()
    PdfWriter().write(out)
    return out.getvalue()


@pytest.fixture
async def client(fake: FakeVLLM, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process in front of `fake`, one preprocessing worker (every file of a
    test goes through the same one, as a busy gateway's files do)."""
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path, max_pages=2)
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


def sent(kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Request options carrying a one-page PDF and `extra`, as a form or as JSON."""
    if kind == "form":
        return {"files": {"file": ("doc.pdf", PAGE)}, "data": extra}
    return {"json": {"file": base64.b64encode(PAGE).decode(), **extra}}


@pytest.mark.parametrize("path", ["/v1/ocr", "/v1/ocr/jobs"])
@pytest.mark.parametrize(
    ("kind", "extra", "name", "hint"),
    [
        ("form", {"max_token": "16"}, "max_token", "did you mean `max_tokens`?"),
        ("json", {"maxTokens": 16}, "maxTokens", "did you mean `max_tokens`?"),
        ("json", {"foo": 1}, "foo", ""),
        ("form", {"foo": "bar", "max_tokens": "16"}, "foo", ""),
    ],
)
async def test_an_unknown_field_is_refused_naming_it(
    client: httpx.AsyncClient,
    fake: FakeVLLM,
    path: str,
    kind: str,
    extra: dict[str, Any],
    name: str,
    hint: str,
) -> None:
    """A misspelt or unknown form or JSON field is a 400 `unknown_parameter` whose `param` is
    the field (a close known name suggested), as chat answers one; nothing is read."""
    answer = await client.post(path, **sent(kind, extra))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("unknown_parameter", name)
    assert f"Unrecognized request argument supplied: {name}" in error["message"]
    assert hint in error["message"]
    assert fake.bodies == []


async def test_a_file_part_under_another_name_is_refused_naming_it(
    client: httpx.AsyncClient,
) -> None:
    """A multipart upload whose file is the `image` part: 400 `unknown_parameter` `image`."""
    answer = await client.post("/v1/ocr", files={"image": ("doc.pdf", PAGE)})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["param"]) == (
        400,
        "unknown_parameter",
        "image",
    )


async def test_paddlexs_route_still_ignores_unknown_fields(client: httpx.AsyncClient) -> None:
    """/layout-parsing takes `maxTokens` and `foo` and reads the page, as PaddleX does."""
    body = {"file": base64.b64encode(PAGE).decode(), "useLayoutDetection": False}
    answer = await client.post("/layout-parsing", json={**body, "maxTokens": 16, "foo": 1})
    assert answer.status_code == 200, answer.text


class Recording(dict[str, Any]):
    """A fields dict that records every name read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_declared_fields_are_the_fields_read() -> None:
    """upload.FIELDS (the one declaration) names every field the options parser reads, and
    only those (`file` is read by the route): a field added to one is added to the other."""
    fields = Recording()
    upload.parse_options(fields)
    assert fields.read | {"file"} == set(upload.FIELDS)


async def test_a_pdf_with_no_pages_is_empty_pdf_whatever_came_before(
    client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A 0-page PDF is 400 `empty_pdf` on /v1/ocr, jobs and /layout-parsing, before and after
    an encrypted and a corrupt PDF went through the same worker (PDFium's last error was read
    for it: `encrypted_pdf` or `corrupt_file` by what came before)."""
    empty = no_pages()
    codes = []
    for before in (b"", encrypted_pdf(), b"%PDF-1.4 not really", encrypted_pdf()):
        if before:
            await client.post("/v1/ocr", files={"file": ("x.pdf", before)})
        for path in ("/v1/ocr", "/v1/ocr/jobs"):
            answer = await client.post(path, files={"file": ("e.pdf", empty)})
            assert answer.status_code == 400, answer.text
            codes.append(answer.json()["error"]["code"])
        body = {"file": base64.b64encode(empty).decode(), "useLayoutDetection": False}
        paddlex = await client.post("/layout-parsing", json=body)
        assert paddlex.status_code == 422, paddlex.text
        codes.append("empty_pdf" if "(empty_pdf)" in paddlex.json()["errorMsg"] else paddlex.text)
    assert set(codes) == {"empty_pdf"}
    assert fake.bodies == []


def test_ocrvl_ocr_says_a_pdf_has_no_pages(fake: FakeVLLM, tmp_path: Path) -> None:
    """`ocrvl ocr` on a 0-page PDF, after an encrypted one: exit 2, "the PDF has no pages"."""
    app = create_app(settings_for(fake.url, preprocess_workers=1))
    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf())
    (tmp_path / "empty.pdf").write_bytes(no_pages())
    env = {**os.environ, "OCRVL_API_KEY": CLIENT_KEY}
    with ThreadedServer(app) as server:
        command = [OCRVL, "ocr", "--url", server.url]
        runs = [
            subprocess.run(
                [*command, str(path)], capture_output=True, text=True, env=env, timeout=120
            )
            for path in (tmp_path / "locked.pdf", tmp_path / "empty.pdf")
        ]
    assert [run.returncode for run in runs] == [2, 2]
    assert "encrypted" in runs[0].stderr
    assert "HTTP 400: the PDF has no pages" in runs[1].stderr


@pytest.mark.parametrize(
    ("file", "code", "words"),
    [
        (123, "invalid_type", "`file` must be a string"),
        ("file:///etc/passwd", "invalid_value", "`file` is a file: URL, which the server does not"),
        ("!!!@@@", "invalid_request", "`file` is not valid base64"),
    ],
)
async def test_a_file_that_is_no_file_says_what_it_is(
    client: httpx.AsyncClient, file: object, code: str, words: str
) -> None:
    """`file` as a number, a file: URL or characters no base64 has: a 400 on `file` saying
    which (not "required", not "not valid base64" for a URL)."""
    answer = await client.post("/v1/ocr", json={"file": file})
    error = answer.json()["error"]
    assert (answer.status_code, error["param"], error["code"]) == (400, "file", code)
    assert words in error["message"]


@pytest.mark.parametrize(
    ("file", "words"),
    [
        ("file:///etc/passwd", "`file` is a file: URL, which the server does not fetch"),
        ("!!!@@@", "`file` is neither valid base64 nor an http(s) URL"),
    ],
)
async def test_paddlexs_route_says_what_a_file_that_is_no_file_is(
    client: httpx.AsyncClient, file: str, words: str
) -> None:
    """/layout-parsing: a file: URL is named as one; characters PaddleX's lenient base64 skips
    entirely are not base64 (not "`file` is empty")."""
    answer = await client.post("/layout-parsing", json={"file": file, "useLayoutDetection": False})
    assert answer.status_code == 422
    assert words in answer.json()["errorMsg"]


async def test_paddlexs_refusals_name_its_own_fields(client: httpx.AsyncClient) -> None:
    """/layout-parsing: a file over OCRVL_MAX_PAGES is not told to choose pages with `pages`
    (the route has none); `maxNewTokens` over the model's length is explained as itself."""
    body = {"file": base64.b64encode(pdf(3)).decode(), "useLayoutDetection": False}
    many = (await client.post("/layout-parsing", json=body)).json()["errorMsg"]
    assert "choose some with `pages`" not in many
    assert "split it into parts of at most that many pages" in many
    body = {"file": base64.b64encode(PAGE).decode(), "useLayoutDetection": False}
    tokens = await client.post("/layout-parsing", json={**body, "maxNewTokens": 100_000})
    message = tokens.json()["errorMsg"]
    assert message.startswith("`maxNewTokens` is 100000; this gateway allows at most"), message
    assert "max_tokens" not in message
