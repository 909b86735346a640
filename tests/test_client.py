"""`ocrvl ocr FILE...` (no `--job`) interrupted mid-file: no traceback, exit 130, its output
never taken for a whole one, and the files after it not sent."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from app import cli, client
from app.jobs.commands import INTERRUPTED
from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import ThreadedServer


def recorded(app: ASGIApp, seen: list[str]) -> ASGIApp:
    """`app`, every HTTP request it receives noted as `METHOD PATH` the moment it arrives."""

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            seen.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    return recording


@pytest.mark.parametrize("to", ["an --out folder", "stdout"])
def test_ctrl_c_mid_file_marks_its_output_partial_and_sends_no_other_file(
    to: str,
    fake: FakeVLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ocrvl ocr A B C` against a real gateway, one Ctrl-C once A's first page of three is
    written: exit 130; an --out file is renamed NAME.partial with that page alone (stdout keeps
    it), stderr says so and lists B and C, and neither ever reaches the gateway."""
    files = [tmp_path / name for name in ("a.pdf", "b.pdf", "c.pdf")]
    for file, count in zip(files, (3, 1, 1), strict=True):
        file.write_bytes(pdf(count))
    pressed: list[str] = []
    step = client.Progress.step

    def ctrl_c_once(self: Any, failed: bool) -> None:  # one press, as page 1 is written
        step(self, failed)
        if not pressed:
            pressed.append(self.name)
            raise KeyboardInterrupt

    monkeypatch.setattr(client.Progress, "step", ctrl_c_once)
    out = tmp_path / "out"
    seen: list[str] = []
    settings = settings_for(fake.url, ocr_page_concurrency=1)  # page 1 comes back first
    with ThreadedServer(recorded(create_app(settings), seen)) as gateway:
        argv = ["ocr", *map(str, files), "--url", gateway.url, "--key", CLIENT_KEY]
        argv += ["--out", str(out)] if to != "stdout" else []
        try:
            code = cli.main(argv)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C escaped `ocrvl ocr`: a traceback, not a message")
        requests = list(seen)
    printed = capsys.readouterr()  # stderr: the gateway's log lines too (it runs in-process)
    assert pressed == ["a.pdf"]
    assert code == INTERRUPTED
    assert requests == ["POST /v1/ocr"], "a file after the Ctrl-C reached the gateway"
    said = f"ocrvl ocr: interrupted while reading {files[0]}: "
    if to == "stdout":
        assert printed.out == "Hello page"
        assert f"{said}only 1 of 3 pages written to stdout\n" in printed.err
    else:
        whole, partial = out / "a.pdf.md", out / "a.pdf.md.partial"
        assert [path.name for path in out.iterdir()] == [partial.name]
        assert partial.read_text() == "Hello page"
        assert f"{said}{whole} held only 1 of 3 pages: renamed {partial}\n" in printed.err
    assert f"ocrvl ocr: interrupted; not sent: {shlex.join(map(str, files[1:]))}\n" in printed.err
