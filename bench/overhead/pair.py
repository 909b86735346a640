"""The processes of bench.overhead.policy: the stand-in backend and gateways running given code."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.overhead import BACKEND_KEY, CLIENT_KEY, MODEL
from bench.overhead.processes import VENV_BIN, spawn, stop, wait_ready
from tests.support.servers import free_port


def gateway_env(backend: str, folder: Path) -> dict[str, str]:
    """`ocrvl serve`'s environment: production defaults, its code from `folder`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    return {
        **clean,
        "PYTHONPATH": str(folder),
        "OCRVL_BACKENDS": backend,
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_LOG_LEVEL": "info",
    }


@contextlib.contextmanager
def stand_in(workdir: Path) -> Iterator[str]:
    """bench.overhead's stand-in backend, answering at once; its URL."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    port = free_port()
    command = [sys.executable, "-m", "bench.overhead", "--serve-backend", str(port)]
    command += ["--served", MODEL, "--backend-delay-ms", "0", "--chunk-interval-ms", "0"]
    process = spawn(command, workdir / "backend.log", clean)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", process, workdir / "backend.log")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@contextlib.contextmanager
def gateway(
    workdir: Path,
    name: str,
    folder: Path,
    backend: str,
    wrapper: tuple[str, ...] = (),
    **env: str,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One `ocrvl serve` running `folder`'s code (under `wrapper`, e.g. valgrind, with `env`
    added); its URL and process."""
    port = free_port()
    serve = [*wrapper, str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
    log = workdir / f"{name}.log"
    process = spawn([*serve, "--port", str(port)], log, {**gateway_env(backend, folder), **env})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/ready", process, log, within=300 if wrapper else 30)
        yield url, process
    finally:
        stop(process)


@contextlib.contextmanager
def gateways(
    workdir: Path, code: dict[str, Path]
) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """The stand-in backend and one gateway per entry of `code`; their URLs and pids."""
    with stand_in(workdir) as backend, contextlib.ExitStack() as stack:
        urls, pids = {}, {}
        for name, folder in code.items():
            urls[name], process = stack.enter_context(gateway(workdir, name, folder, backend))
            pids[name] = process.pid
        yield urls, pids
