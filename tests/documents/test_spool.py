"""A full temp folder while a document is spooled: 503 with Retry-After, nothing left behind.

A real disk cannot fill up on demand here, so the write that would hit ENOSPC raises it (an
injected fault); the backend is FakeVLLM for the same reason as in test_fanout.
"""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette import formparsers

from app.documents import upload
from tests.support.documents import full, leftovers, pdf
from tests.support.fake_backend import FakeVLLM

pytestmark = pytest.mark.anyio
DOCUMENT = {"file": ("doc.pdf", pdf(1, 200, 280), "application/pdf")}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gateway's temp folder, empty at the start."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def assert_no_room(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "5"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "server_overloaded")
    assert "temp folder is full" in error["message"]


async def test_no_room_to_copy_the_file_is_a_503_and_leaves_no_file(
    fake: FakeVLLM,
    gateway_client: httpx.AsyncClient,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The copy for the workers fails with ENOSPC: 503 + Retry-After, the half-written file is
    gone, no page reached the backend, and the next document (room again) is read."""
    with monkeypatch.context() as patch:
        patch.setattr(upload.shutil, "copyfileobj", full)
        refused = await gateway_client.post("/v1/ocr", files=DOCUMENT)
    assert_no_room(refused)
    assert not leftovers(folder)
    assert fake.bodies == []
    served = await gateway_client.post("/v1/ocr", files=DOCUMENT)
    assert served.status_code == 200, served.text
    assert len(fake.bodies) == 1
    assert not leftovers(folder)


async def test_no_room_while_the_upload_is_received_is_a_503(
    gateway_client: httpx.AsyncClient, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starlette's own spool of the multipart upload fails with ENOSPC: the same 503."""

    class FullSpool(tempfile.SpooledTemporaryFile):  # type: ignore[type-arg]
        write = full

    with monkeypatch.context() as patch:
        patch.setattr(formparsers, "SpooledTemporaryFile", FullSpool)
        refused = await gateway_client.post("/v1/ocr", files=DOCUMENT)
    assert_no_room(refused)
    assert (await gateway_client.post("/v1/ocr", files=DOCUMENT)).status_code == 200


async def test_no_room_to_create_the_file_is_the_same_503(
    fake: FakeVLLM,
    gateway_client: httpx.AsyncClient,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spooled file cannot even be created (ENOSPC on mkstemp: no inode left): the same
    503, not a 500, and the next document is read."""
    with monkeypatch.context() as patch:
        patch.setattr(upload.tempfile, "mkstemp", full)
        refused = await gateway_client.post("/v1/ocr", files=DOCUMENT)
    assert_no_room(refused)
    assert fake.bodies == []
    assert (await gateway_client.post("/v1/ocr", files=DOCUMENT)).status_code == 200
    assert not leftovers(folder)


def test_other_os_errors_stay_what_they_are() -> None:
    """Only ENOSPC and EDQUOT mean "no room"; EIO is not turned into a 503."""
    broken = OSError(errno.EIO, "I/O error")
    assert upload.no_room(broken) is broken
    assert isinstance(upload.no_room(OSError(errno.EDQUOT, "quota")), upload.Overloaded)
