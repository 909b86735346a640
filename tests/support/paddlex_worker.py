"""One long-lived process in `.venv-paddleocr` that runs PaddleX's scripts, one call at a time.

Each script (tests/paddlex/paddlex_serving.py, tests/support/paddlex_fixed_layout.py) used to run
as a fresh `python SCRIPT SPEC OUT`, paying PaddleX's import (10-15 s on CI's 2 cores) every
time. The worker imports the modules it is told to once, then serves each call in a child that
it forks: the child takes the call's cwd, environment and argv and runs the script as
`__main__` (`runpy`), so it starts from the state a fresh process would reach after those
imports, and nothing a script patches, caches or leaves running outlives its call. Variables
PaddleX reads at import (`PADDLE_PDX_CACHE_HOME`, `PADDLE_PDX_LOCAL_FONT_FILE_PATH`, …) take the
worker's values: give it the same ones as every call.

Both venvs run this file, so it imports only the standard library. The test side uses `Worker`;
the worker side is this file as a script:

    .venv-paddleocr/bin/python tests/support/paddlex_worker.py REPLY_FD [MODULE ...]

Calls arrive as JSON lines on stdin ({"script", "argv", "cwd", "env"}), and each is answered
with a line ({"code": the child's exit status, negative for a signal}) on REPLY_FD, a pipe of
its own, so that nothing PaddleX prints (to stdout or stderr, both the worker's log) can be
taken for an answer. The worker ends when its stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

TAIL = 4000  # characters of output a failed call reports


@dataclass(frozen=True)
class Finished:
    """One call's end: the script's exit status, or why there is none, and what it printed."""

    code: int | None  # None when the call never finished (the worker died or was killed)
    why: str  # "exit 0", "the worker died (exit -9)", "timed out after 300 s: …"
    output: str  # the tail of what the worker printed during the call


class Worker:
    """The test side: starts the worker at the first call, and again after one died or was
    killed; `stop()` ends it (by its PID) and removes `home` (its log lives there)."""

    def __init__(
        self,
        python: Path,
        home: Path,
        environment: Mapping[str, str],
        preload: Sequence[str] = (),
    ) -> None:
        self.python, self.home = python, home
        self.environment, self.preload = dict(environment), tuple(preload)
        self.log = home / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.replies: int | None = None  # the read end of the reply pipe
        self.starts = 0  # how many worker processes it has started
        self._lock = threading.Lock()

    def run(
        self,
        script: Path,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        timeout: float,
    ) -> Finished:
        """`python SCRIPT *argv` in `cwd` with exactly `env` as its environment, in the worker;
        a call that takes longer than `timeout` seconds (the worker's imports included, the
        first time) kills the worker."""
        with self._lock:
            process, replies = self._started()
            offset = self.log.stat().st_size
            request = {"script": str(script), "argv": list(argv), "cwd": str(cwd), "env": dict(env)}
            try:
                assert process.stdin is not None
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.flush()
            except BrokenPipeError:
                return self._died(offset)
            try:
                line = self._reply(replies, time.monotonic() + timeout)
            except TimeoutError:
                self._kill()
                why = f"timed out after {timeout:g} s: the worker was killed"
                return Finished(None, why, self._output(offset))
            except BaseException:  # e.g. pytest-timeout: its answer must not be the next call's
                self._kill()
                raise
            if line is None:
                return self._died(offset)
            code = json.loads(line)["code"]
            return Finished(code, f"exit {code}", self._output(offset))

    def stop(self) -> None:
        """End the worker (stdin closed, then SIGKILL after 10 s) and remove `home`."""
        with self._lock:
            process = self.process
            if process is not None and process.poll() is None:
                assert process.stdin is not None
                with contextlib.suppress(OSError):
                    process.stdin.close()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._kill()
            self._forget()
            shutil.rmtree(self.home, ignore_errors=True)

    def _started(self) -> tuple[subprocess.Popen[bytes], int]:
        if self.process is not None and self.process.poll() is None and self.replies is not None:
            return self.process, self.replies
        self._forget()
        self.home.mkdir(parents=True, exist_ok=True)
        read, write = os.pipe()
        try:
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    [str(self.python), __file__, str(write), *self.preload],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    env=self.environment, cwd=self.home, pass_fds=(write,),
                    start_new_session=True,  # its own process group: a kill takes its children
                )  # fmt: skip
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.replies, self.starts = read, self.starts + 1
        return self.process, read

    def _reply(self, replies: int, deadline: float) -> bytes | None:
        """The next answer line, or None at EOF (the worker died); TimeoutError past
        `deadline`."""
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([replies], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(replies, 65536)
            if not chunk:
                return None
            line += chunk
        return line

    def _died(self, offset: int) -> Finished:
        assert self.process is not None
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # the reply pipe closed, but it lingers
            self._kill()
            code = self.process.returncode
        output = self._output(offset)
        self._forget()
        return Finished(None, f"the worker died (exit {code})", output)

    def _kill(self) -> None:
        """SIGKILL to the worker's process group (its PID: it leads its own session)."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._forget()

    def _forget(self) -> None:
        if self.process is not None:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        if self.replies is not None:
            os.close(self.replies)
        self.process, self.replies = None, None

    def _output(self, offset: int) -> str:
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")[-TAIL:]


# ------------------------------------------------------------------------------ the worker side


def serve(replies: IO[str], modules: Sequence[str]) -> None:
    """Import `modules`, then answer each call on stdin with its child's exit status."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the script will meet the same error and report it as its own
            traceback.print_exc()
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        code = forked(request, replies.fileno())
        replies.write(json.dumps({"code": code}) + "\n")
        replies.flush()


def forked(request: dict[str, Any], replies: int) -> int:
    """The request's script in a child; the child's exit status (negative: killed by that
    signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(replies)
            stdin = os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin, 0)
            os.close(stdin)
            code = as_script(request)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def as_script(request: dict[str, Any]) -> int:
    """What `python SCRIPT *argv` would exit with, run in this process."""
    import runpy  # noqa: PLC0415

    script = request["script"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [script, *request["argv"]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    replies = os.fdopen(int(sys.argv[1]), "w")
    os.dup2(2, 1)  # stdout is the log too (already, from the test side; this makes sure)
    sys.stdout = sys.stderr
    serve(replies, sys.argv[2:])


if __name__ == "__main__":
    main()
