"""Scratch files and folders a gateway killed outright left in the temp folder: the next
gateway's lifespan deletes them, never a live gateway's."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from app import scratch
from app.main import create_app
from tests.conftest import settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import lifespan_client


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder, empty at the start."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def left(temp: Path, kind: str, pid: int, folder: bool) -> Path:
    """An entry of `kind` named as process `pid` would name it, with a document in it."""
    path = temp / f"ocrvl-{kind}-{pid}-abc123"
    if folder:
        path.mkdir()
        (path / "document.pdf").write_bytes(b"%PDF-1.7")
    else:
        path.write_bytes(b"%PDF-1.7")
    return path


def test_every_kind_a_dead_process_left_goes_and_a_live_ones_and_others_stay(temp: Path) -> None:
    """Files and folders of every kind whose process is gone are deleted; a live process's
    (this test's parent), names that only look alike, and a pid too large to be one stay."""
    dead = dead_pid()
    gone = [left(temp, kind, dead, folder=n % 2 == 0) for n, kind in enumerate(scratch.KINDS)]
    kept = [
        left(temp, "upload", os.getppid(), folder=False),
        left(temp, "job", os.getppid(), folder=True),
        temp / f"ocrvl-test-data-{dead}-abc",  # not a scratch kind
        temp / f"ocrvl-upload-{dead}",  # no random part
        temp / "ocrvl-upload-99999999999999999999999-abc",  # no pid at all
        temp / f"ocr-{dead}-abc",
    ]
    for path in kept[2:]:
        path.write_bytes(b"x")
    assert scratch.sweep() == len(gone)
    assert sorted(temp.iterdir()) == sorted(kept)


def test_this_pid_entries_older_than_this_process_go_and_its_own_stay(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted container's gateway often has its predecessor's pid: what bears it and
    predates this process was the predecessor's; what this process made stays."""
    entry = Path(scratch.folder("job"))
    made = entry.stat().st_ctime
    monkeypatch.setattr(scratch, "STARTED", made - 1.0)  # made by this process
    assert (scratch.sweep(), list(temp.iterdir())) == (0, [entry])
    monkeypatch.setattr(scratch, "STARTED", made + 1.0)  # made before this process began
    assert (scratch.sweep(), list(temp.iterdir())) == (1, [])


def test_a_kind_the_sweep_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="no scratch kind 'uploads'"):
        scratch.prefix("uploads")


def test_the_names_carry_the_kind_and_this_pid(temp: Path) -> None:
    made = Path(scratch.folder("pixels"))
    assert made.parent == temp
    assert made.name.startswith(f"ocrvl-pixels-{os.getpid()}-")
    assert scratch.prefix("upload") == f"ocrvl-upload-{os.getpid()}-"


@pytest.mark.anyio
async def test_a_gateway_starting_deletes_what_a_killed_one_left(
    temp: Path, fake: FakeVLLM
) -> None:
    """The lifespan sweeps before it serves: a killed gateway's spooled upload and job folder
    are gone once the next one answers, a live gateway's upload is still there."""
    dead = dead_pid()
    upload, job = left(temp, "upload", dead, folder=False), left(temp, "job", dead, folder=True)
    alive = left(temp, "upload", os.getppid(), folder=False)
    async with lifespan_client(create_app(settings_for(fake.url))) as client:
        assert (await client.get("/health")).status_code == 200
        assert not upload.exists()
        assert not job.exists()
        assert alive.exists()
