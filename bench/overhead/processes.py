"""The backend and gateway subprocesses: start, pin and stop them, and read their CPU time."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.overhead import BACKEND_KEY, CLIENT_KEY, ROOT
from tests.support.servers import free_port

VENV_BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")
SCHEDSTAT = Path("/proc/self/schedstat").exists()  # per-thread run time in ns
READY_WITHIN = 30  # seconds for a subprocess to start answering


@dataclass
class Servers:
    """The running backend and gateway."""

    backend: str
    gateway: str
    gateway_log: Path
    pids: dict[str, int]


def spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def wait_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, within: float = READY_WITHIN
) -> None:
    """Poll `url` until it answers 200; exit with the log's tail if the process dies or it
    takes longer than `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{url}: exited with {process.returncode}\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    sys.exit(f"{url} not ready after {within:g} s\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pin(pid: int, cpus: set[int]) -> None:
    """Bind every thread of `pid` to `cpus` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def running(
    workdir: Path,
    *,
    served: str,
    backend_delay_ms: float,
    pinned: bool,
    chunk_interval_ms: float = 0.0,
) -> Iterator[Servers]:
    """Start the stand-in backend and `ocrvl serve` in front of it; stop both at the end."""
    ports = {"backend": free_port(), "gateway": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    gateway_env = {
        **clean,
        "OCRVL_BACKENDS": urls["backend"],
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_LOG_LEVEL": "info",  # the production default: the access line is part of the cost
    }
    backend_cmd = [sys.executable, "-m", "bench.overhead", "--serve-backend", str(ports["backend"])]
    backend_cmd += ["--served", served, "--backend-delay-ms", str(backend_delay_ms)]
    backend_cmd += ["--chunk-interval-ms", str(chunk_interval_ms)]
    gateway_cmd = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    gateway_cmd += ["--port", str(ports["gateway"])]
    starts = {
        "backend": (backend_cmd, clean, "/health"),
        "gateway": (gateway_cmd, gateway_env, "/ready"),
    }
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as stack:  # stops the started processes, last first
        for name, (command, env, probe) in starts.items():
            log = workdir / f"{name}.log"
            process = spawn(command, log, env)
            stack.callback(stop, process)
            wait_ready(f"{urls[name]}{probe}", process, log)
            pids[name] = process.pid
        if pinned:  # the gateway gets a core of its own; backend and load generator share one
            pin(pids["gateway"], {1})
            pin(pids["backend"], {0})
            pin(os.getpid(), {0})
        yield Servers(urls["backend"], urls["gateway"], workdir / "gateway.log", pids)


def process_seconds(pid: int) -> float:
    """CPU seconds `pid` used so far (user + system): its live threads' run time to the
    nanosecond (schedstat), else its clock ticks (a tick is 10 ms: too coarse for a cell of
    a few hundred ~1 ms requests)."""
    if not SCHEDSTAT:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    nanoseconds = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            nanoseconds += int((task / "schedstat").read_text().split()[0])
    return nanoseconds / 1e9


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far (user + system, all threads) by our processes and everyone else."""
    used = {name: process_seconds(pid) for name, pid in pids.items()}
    used["load_generator"] = time.process_time()
    user, nice, system, _, _, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    ours = used["backend"] + used["gateway"] + used["load_generator"]
    used["others"] = (user + nice + system + irq + softirq) / TICK - ours
    return used
