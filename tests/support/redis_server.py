"""A real `redis-server` (the Debian package) on a loopback port, killed and restarted by PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.servers import free_port

START_TIMEOUT = 10.0


class RedisServer:
    """One `redis-server` on 127.0.0.1 with a password, no persistence, and its own log."""

    def __init__(self, log_dir: Path, password: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.url = f"redis://:{password}@127.0.0.1:{self.port}/0"
        self.log_path = log_dir / f"redis-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start it (again, on the same port) and wait until it accepts connections."""
        command = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--requirepass", self.password,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                time.sleep(0.05)
            else:
                return self
        raise RuntimeError(f"redis-server did not listen on {self.port} in {START_TIMEOUT} s")

    def kill(self) -> None:
        """SIGKILL by PID, as a crash would end it (nothing is saved)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM by PID, and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
