"""`ocrvl ocr FILE --job` interrupted: the job goes on, the CLI says how to pick it up, and the
files after it are not sent; `ocrvl jobs` interrupted: one line, exit 130."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import cli
from app.jobs import commands
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import ThreadedServer

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


def interrupted(fake: FakeVLLM, tmp_path: Path, files: list[Path]) -> tuple[int, list[Any]]:
    """`ocrvl ocr FILES --job` against a real gateway whose path a test made Ctrl-C on: its
    exit status (a Ctrl-C escaping it fails the test: a traceback) and the jobs the gateway
    then holds."""
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=tmp_path / "data")
    with ThreadedServer(create_app(settings)) as gateway:
        argv = ["ocr", *map(str, files), "--job", "--url", gateway.url, "--key", CLIENT_KEY]
        try:
            code = cli.main(argv)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C escaped `ocrvl ocr --job`: a traceback, not a message")
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        with httpx.Client(base_url=gateway.url, headers=headers, trust_env=False) as http:
            return code, http.get("/v1/ocr/jobs").json()["data"]


def test_ctrl_c_with_several_files_stops_the_command_and_names_the_files_not_sent(
    fake: FakeVLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ocrvl ocr A B C --job` against a real gateway, one Ctrl-C while A's job is followed: exit
    130, A's job goes on (its id named), B and C never become jobs and stderr lists them."""
    files = [tmp_path / name for name in ("a.pdf", "b.pdf", "c.pdf")]
    for file in files:
        file.write_bytes(pdf(1))
    pressed: list[str] = []

    def ctrl_c_once(self: Any, total: int) -> None:  # one press, as A's id is out
        if not pressed:
            pressed.append(self.name)
            raise KeyboardInterrupt

    monkeypatch.setattr(commands.Progress, "start", ctrl_c_once)
    monkeypatch.setattr(commands, "POLL_EVERY", 0)
    code, held = interrupted(fake, tmp_path, files)
    err = capsys.readouterr().err  # the gateway's log lines too: it runs in this process
    assert pressed == ["a.pdf"]
    first = err.split("a.pdf: job ")[1].split()[0]
    assert [job["id"] for job in held] == [first], "files after the Ctrl-C became jobs"
    assert code == commands.INTERRUPTED
    assert f"interrupted; job {first} goes on: `ocrvl jobs status {first}`" in err
    assert f"ocrvl ocr: interrupted; not sent: {shlex.join(map(str, files[1:]))}\n" in err


@pytest.mark.parametrize("answered", [False, True], ids=["before it arrives", "as it answers"])
def test_ctrl_c_while_a_file_is_sent_as_a_job_says_it_may_be_one_and_sends_no_other(
    answered: bool,
    fake: FakeVLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ocrvl ocr A B C --job`, one Ctrl-C while A's POST is in flight (before the gateway has
    it, or as its answer comes: A then is a job whose id the command never read): exit 130,
    stderr says A may be a job and lists B and C, which never become jobs."""
    files = [tmp_path / name for name in ("a.pdf", "b.pdf", "c.pdf")]
    for file, count in zip(files, (2, 1, 1), strict=True):
        file.write_bytes(pdf(count))
    post = httpx.Client.post
    pressed: list[str] = []

    def ctrl_c_once(self: httpx.Client, url: str, **options: Any) -> httpx.Response:
        if pressed:
            return post(self, url, **options)
        pressed.append(url)
        if answered:
            post(self, url, **options)
        raise KeyboardInterrupt

    monkeypatch.setattr(httpx.Client, "post", ctrl_c_once)
    code, held = interrupted(fake, tmp_path, files)
    err = capsys.readouterr().err  # the gateway's log lines too: it runs in this process
    assert pressed == ["/v1/ocr/jobs"]
    assert code == commands.INTERRUPTED
    # A's job (its 2 pages) when the gateway had the POST, none otherwise: never B's or C's
    assert [job["pages_total"] for job in held] == ([2] if answered else [])
    assert (
        f"ocrvl ocr: interrupted while sending {files[0]}: it may or may not have become a job "
        "(`ocrvl jobs list` shows it)\n"
    ) in err
    assert "a.pdf: job " not in err
    assert f"ocrvl ocr: interrupted; not sent: {shlex.join(map(str, files[1:]))}\n" in err


@pytest.mark.parametrize(
    "action",
    [["status", "job_abc"], ["result", "job_abc"], ["cancel", "job_abc"], ["list"]],
    ids=lambda action: action[0],
)
def test_ctrl_c_mid_request_ends_a_jobs_command_in_one_line(
    action: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ocrvl jobs ACTION` interrupted while its request is out: exit 130 and one line on
    stderr, never a traceback."""

    def ctrl_c(self: httpx.Client, request: httpx.Request, **_: Any) -> httpx.Response:
        raise KeyboardInterrupt

    monkeypatch.setattr(httpx.Client, "send", ctrl_c)
    try:
        code = cli.main(["jobs", *action, "--url", "http://127.0.0.1:9"])
    except KeyboardInterrupt:
        pytest.fail(f"Ctrl-C escaped `ocrvl jobs {action[0]}`: a traceback, not a message")
    assert code == commands.INTERRUPTED
    assert capsys.readouterr().err == "ocrvl jobs: interrupted\n"
