"""The real layout service for tests: `python -m ocrvl_layout` from the engine venv on a free
loopback port, ready when it prints its ready line, stopped by its PID.

`--port 0` lets the service bind any free port itself and name it in its ready line
(`ocrvl-layout ready on http://127.0.0.1:PORT (...)`), so no port is picked here that another
process could take first. Everything it prints goes to a log file; a service that exits or
stays silent past the timeout fails the test with the log's tail. Nothing here imports torch:
the gateway venv's tests use it too (tests/conftest.py's `layout_service` fixture).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("OCRVL_ENGINE_VENV", ROOT / ".venv"))
READY_LINE = "ocrvl-layout ready on "
START_TIMEOUT = 300.0  # loading and one warm-up pass take seconds; CI machines are shared


def tiny_layout_dir() -> Path:
    """The tiny PP-DocLayoutV3 (`make tiny-layout`); built by the engine venv if absent."""
    folder = Path(os.environ.get("TINY_LAYOUT_DIR", ROOT / ".cache" / "tiny-layout"))
    if not (folder / "config.json").exists():
        subprocess.run(
            [str(ENGINE_VENV / "bin" / "python"), "-m", "tests.support.tiny_layout", str(folder)],
            cwd=ROOT,
            check=True,
            timeout=900,
        )
    return folder


def tiny_preprocess_dir() -> Path:
    """The tiny orientation and unwarping checkpoints (`make tiny-preprocess`: orientation/,
    unwarping/); built by the engine venv if absent."""
    folder = Path(os.environ.get("TINY_PREPROCESS_DIR", ROOT / ".cache" / "tiny-preprocess"))
    if not (folder / "unwarping" / "config.json").exists():
        subprocess.run(
            [str(ENGINE_VENV / "bin" / "python"), "-m", "tests.support.tiny_preprocess",
             str(folder)],
            cwd=ROOT, check=True, timeout=900,
        )  # fmt: skip
    return folder


def preprocessing_flags() -> tuple[str, ...]:
    """The flags that give the service the tiny preprocessing checkpoints."""
    folder = tiny_preprocess_dir()
    return (
        "--orientation-model", str(folder / "orientation"),
        "--unwarping-model", str(folder / "unwarping"),
    )  # fmt: skip


def tail(path: Path, lines: int = 60) -> str:
    """The last lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


@dataclass
class LayoutService:
    """A running `python -m ocrvl_layout`."""

    url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    start_seconds: float
    _reader: threading.Thread = field(repr=False)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM by PID, then SIGKILL if it outlives `grace`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_layout_service(
    log_path: Path,
    *args: str,
    model: Path | None = None,
    timeout: float = START_TIMEOUT,
    **env: str,
) -> LayoutService:
    """The service on the tiny checkpoint (or `model`) with extra flags `args` and `env`
    variables, once it says it is ready; the caller stops it."""
    python = ENGINE_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no engine venv at {ENGINE_VENV}: run `make venv`")
    command = [
        str(python),
        "-m",
        "ocrvl_layout",
        "--model",
        str(model or tiny_layout_dir()),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--device",
        "cpu",
        *args,
    ]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **env}
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
    )
    said: list[str] = []
    heard = threading.Event()  # the ready line, or the end of the output (the process died)
    reader = threading.Thread(
        target=_copy_output, args=(process, log_path, said, heard), daemon=True
    )
    reader.start()
    heard.wait(timeout)
    service = LayoutService("", log_path, process, time.monotonic() - started, reader)
    if not said:
        service.stop()
        state = f"exited with {process.returncode}" if process.poll() is not None else "silent"
        pytest.fail(
            f"the layout service {state} after {time.monotonic() - started:.0f} s "
            f"without its ready line ({' '.join(command)})\n{tail(log_path)}"
        )
    service.url = said[0]
    return service


def _copy_output(
    process: subprocess.Popen[bytes], log_path: Path, said: list[str], heard: threading.Event
) -> None:
    """Copy the service's output into its log; on the ready line, note its URL and signal."""
    assert process.stdout is not None
    with log_path.open("wb") as log:
        for line in process.stdout:
            log.write(line)
            log.flush()
            text = line.decode(errors="replace")
            if READY_LINE in text and not said:
                said.append(text.split(READY_LINE, 1)[1].split()[0])
                heard.set()
    heard.set()
