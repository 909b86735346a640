"""A stand-in backend (bench.overhead's, each answer held back `delay_ms`) and a real
`ocrvl serve` with its job store in `workdir` (from the removed bench.jobs memory, commit
201f28b)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.overhead import BACKEND_KEY, CLIENT_KEY, MODEL
from bench.overhead.processes import VENV_BIN, spawn, stop, wait_ready
from tests.support.servers import free_port


@contextlib.contextmanager
def stack(workdir: Path, delay_ms: float, **env: str) -> Iterator[tuple[str, int]]:
    """The stand-in backend and a gateway with a job store in `workdir`; (gateway URL, pid)."""
    ports = {"backend": free_port(), "gateway": free_port()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    backend = [sys.executable, "-m", "bench.overhead", "--serve-backend", str(ports["backend"])]
    backend += ["--served", MODEL, "--backend-delay-ms", str(delay_ms), "--chunk-interval-ms", "0"]
    gateway = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    gateway += ["--port", str(ports["gateway"])]
    gateway_env = {
        **clean,
        "OCRVL_BACKENDS": f"http://127.0.0.1:{ports['backend']}",
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_DATA_DIR": str(workdir / "data"),
        "OCRVL_JOB_MAX_PAGES": "100000",
        **env,
    }
    processes = []
    try:
        for name, command, environment, probe in (
            ("backend", backend, clean, "/health"),
            ("gateway", gateway, gateway_env, "/ready"),
        ):
            process = spawn(command, workdir / f"{name}.log", environment)
            processes.append(process)
            wait_ready(f"http://127.0.0.1:{ports[name]}{probe}", process, workdir / f"{name}.log")
        yield f"http://127.0.0.1:{ports['gateway']}", processes[-1].pid
    finally:
        for process in reversed(processes):
            stop(process)
