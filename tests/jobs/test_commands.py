"""`ocrvl ocr FILE --job` interrupted: the job goes on, and the CLI says how to pick it up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.jobs import commands

JOB = {"id": "job_abc", "status": "queued", "pages_total": 3, "pages_done": 0, "pages_failed": 0}


class Gateway:
    """An http client stand-in: the job is created, and any status read is a Ctrl-C."""

    def post(self, url: str, **_: Any) -> httpx.Response:
        return httpx.Response(202, json=JOB)

    def get(self, url: str, **_: Any) -> httpx.Response:
        raise KeyboardInterrupt


@pytest.mark.parametrize("at", ["the id just out", "following"])
def test_ctrl_c_once_the_job_exists_leaves_it_running_and_names_it(
    at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C any time after the job's id is on the terminal, the very next instant included
    (tests/real/test_jobs.py presses it then, without waiting), ends in exit 130 and the
    commands that pick the job up again: never a traceback."""
    if at == "the id just out":

        def interrupted(self: Any, total: int) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(commands.Progress, "start", interrupted)
    monkeypatch.setattr(commands, "POLL_EVERY", 0)
    document = tmp_path / "doc.pdf"
    document.write_bytes(b"%PDF-1.4\n")
    try:
        code = commands.follow(Gateway(), document, {}, None, None)
    except KeyboardInterrupt:  # let through, it would end the whole session
        pytest.fail("Ctrl-C escaped `ocrvl ocr --job`: a traceback, not the job's id")
    assert code == commands.INTERRUPTED
    err = capsys.readouterr().err
    assert err.startswith("doc.pdf: job job_abc\n"), err
    assert "interrupted; job job_abc goes on: `ocrvl jobs status job_abc`" in err
