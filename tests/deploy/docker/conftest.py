"""The docker tier's fixtures: a real Docker Engine running the real compose stack.

`docker compose build` builds the real Dockerfile and engine/Dockerfile, and `docker compose up
-d --wait` starts the real docker-compose.yml with GPU_PROFILE=cpu (vLLM and the layout service
from the engine image, on the CPU) and this folder's compose.test.yml, on stand-in base images
built here (no registry is reachable in CI). Without an engine the tier is skipped, except under
CI (`CI` set), where that is a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BACKEND_KEY, ENGINE_VENV, ROOT
from tests.deploy.compose import compose_binary
from tests.support.servers import free_port

HERE = Path(__file__).resolve().parent
PROJECT = "ocrvl-test"
PYTHON_TAG = "ocrvl-stand-in/python:3.11-bookworm"
NGINX_TAG = "ocrvl-stand-in/nginx:1.28"
VLLM_TAG = "ocrvl-stand-in/vllm-openai-cpu:v0.32.0"
GATEWAY_TAG = "ocrvl-stand-in/gateway:test"
ENGINE_NAME = "ocrvl-stand-in/engine"
ENGINE_TAG = f"{ENGINE_NAME}:0.1.0-vllm0.32.0-cpu"  # compose/gpu-profiles.yml's cpu tag
FILES = ("docker-compose.yml", "tests/deploy/docker/compose.test.yml")
# Debian bookworm's python3, the stand-in base's: wheel markers are resolved for its version.
IMAGE_PYTHON = "/usr/bin/python3"
UP_TIMEOUT = 600


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """`docker ARGS`; its stdout. A failure fails the test with docker's own message."""
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The engine's version; no engine: skip, or fail under CI."""
    reason = "no Docker Engine answers (.ci/run starts one)"
    if os.geteuid() != 0:
        reason = "the docker tier runs as root (debootstrap builds its stand-in images)"
    elif shutil.which("docker") is None:
        reason = "no docker command (Debian: apt-get install docker.io)"
    else:
        try:
            result = subprocess.run(
                ["docker", "version", "--format", "{{.Server.Version}}"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            result = None
        if result is not None and result.returncode == 0:
            return result.stdout.strip()
        if result is not None:
            reason = f"{reason}: {result.stderr.strip()}"
    if in_ci():
        pytest.fail(f"CI is set and the docker tier cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def stand_ins(docker_engine: str) -> None:
    """The stand-in base images, built once per engine and then found by their tags."""
    subprocess.run(
        [str(HERE / "images" / "build-stand-ins.sh"), str(ENGINE_VENV)],
        check=True, timeout=900, env={**os.environ, "PYTHON_TAG": PYTHON_TAG,
                                      "NGINX_TAG": NGINX_TAG, "VLLM_TAG": VLLM_TAG},
    )  # fmt: skip


@pytest.fixture(scope="session")
def wheelhouse(docker_engine: str) -> None:
    """wheelhouse/ filled for the stand-in's Python, again only when the locks changed."""
    stamp = ROOT / "wheelhouse" / ".requirements.sha256"
    wanted = [(ROOT / "locks" / name).read_text() for name in ("gateway.txt", "build.txt")]
    digest = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    subprocess.run([str(ROOT / "scripts" / "wheelhouse.sh"), IMAGE_PYTHON], check=True, timeout=900)
    stamp.write_text(digest)


@dataclass
class Stack:
    """The running compose project: nginx's URL on 127.0.0.1 and the client keys."""

    url: str
    keys: dict[str, str]
    env_file: Path
    home: Path

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        """`docker compose -p ocrvl-test -f ... ARGS` with only the env file's variables."""
        command = [str(compose_binary()), "-p", PROJECT, "--project-directory", str(ROOT)]
        for name in FILES:
            command += ["-f", str(ROOT / name)]
        command += ["--env-file", str(self.env_file), *args]
        env = {"PATH": os.environ["PATH"], "HOME": str(self.home)}
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout,
            check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            pytest.fail(f"docker compose {' '.join(args)} failed:\n{result.stderr[-6000:]}")
        return result.stdout + result.stderr

    def save_logs(self) -> Path:
        """Every service's log so far, kept beside the env file for a post-mortem."""
        path = self.home / "compose.log"
        path.write_text(self.compose("logs", "--no-color", "--timestamps", check=False))
        return path

    def container(self, service: str) -> str:
        return f"{PROJECT}-{service}-1"

    def inspect(self, service: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(docker("inspect", self.container(service)))
        return found[0]

    def exec(self, service: str, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "exec", self.container(service), *command],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def containers(self) -> list[str]:
        """Every container of the project, running or not."""
        label = f"label=com.docker.compose.project={PROJECT}"
        return docker("ps", "--all", "--quiet", "--filter", label).split()


def write_keys(folder: Path, names: Sequence[str]) -> dict[str, str]:
    """A keys file from `ocrvl keys create`, owned by the gateway uid (as docs/deploy.md says)."""
    folder.mkdir()
    keys_file = folder / "api-keys.json"
    keys = {}
    for name in names:
        created = subprocess.run(
            [str(Path(sys.prefix) / "bin" / "ocrvl"), "keys", "create", name, "--file",
             str(keys_file)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        keys[name] = created.stdout.split()[0]
    for path in (folder, keys_file):
        os.chown(path, 10001, 10001)
    return keys


def python_home(folder: Path) -> str:
    """The engine venv's base interpreter folder, to mount; Debian's own /usr is the image's."""
    base = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if base.rstrip("/") in ("/usr", ""):
        empty = folder / "no-python-home"
        empty.mkdir(exist_ok=True)
        return str(empty)
    return base


def tiny_layout() -> str:
    """The tiny layout checkpoint (`make tiny-layout`), built by the engine venv when missing."""
    folder = Path(os.environ.get("TINY_LAYOUT_DIR", str(ROOT / ".cache" / "tiny-layout")))
    if not (folder / "config.json").exists():
        subprocess.run(
            [str(ENGINE_VENV / "bin" / "python"), "-m", "tests.support.tiny_layout", str(folder)],
            cwd=ROOT, check=True, timeout=600,
        )  # fmt: skip
    return str(folder)


def env_file(folder: Path, keys_dir: Path, port: int) -> Path:
    """The stack's variables: stand-in images, the tiny checkpoints, loopback-only nginx."""
    values = {
        "GPU_PROFILE": "cpu",
        "VLLM_API_KEY": BACKEND_KEY,
        "PYTHON_IMAGE": PYTHON_TAG,
        "NGINX_IMAGE": NGINX_TAG,
        "VLLM_CPU_IMAGE": VLLM_TAG,
        "GATEWAY_IMAGE": GATEWAY_TAG,
        "ENGINE_IMAGE": ENGINE_NAME,
        # The stand-in's Python is the host venv, bind-mounted at run time only: the build
        # cannot import from it, so the running stack checks the same (test_engine_image.py).
        "ENGINE_CHECK_IMPORTS": "0",
        "PIP_NO_INDEX": "1",
        "NGINX_BIND": "127.0.0.1",
        "NGINX_PORT": str(port),
        "OCRVL_KEYS_DIR": str(keys_dir),
        "MODEL": "/models/tiny",
        "LAYOUT_MODEL": "/models/tiny-layout",
        "ORIENTATION_MODEL": "",  # offline: no preprocessing checkpoints to download
        "UNWARPING_MODEL": "",
        "OCRVL_TEST_VENV": str(ENGINE_VENV),
        "OCRVL_TEST_PYTHON_HOME": python_home(folder),
        "OCRVL_TEST_MODEL": os.environ.get("TINY_MODEL_DIR", str(ROOT / ".cache" / "tiny-model")),
        "OCRVL_TEST_LAYOUT": tiny_layout(),
    }
    path = folder / "stack.env"
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return path


def image_id(tag: str) -> str:
    """The image's id, or "" when there is none by that tag."""
    return docker("image", "inspect", tag, "--format", "{{.Id}}", check=False).strip()


@pytest.fixture(scope="session")
def stack(
    stand_ins: None, wheelhouse: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The whole stack, built and up (`--wait`: every healthcheck passed); down afterwards."""
    folder = tmp_path_factory.mktemp("stack")
    keys = write_keys(folder / "keys", ["ci-client", "ci-burst", "ci-trickle"])
    port = free_port()
    running = Stack(
        f"http://127.0.0.1:{port}", keys, env_file(folder, folder / "keys", port), folder
    )
    running.compose("down", "--volumes", "--remove-orphans", check=False)
    started = time.monotonic()
    previous = {tag: image_id(tag) for tag in (GATEWAY_TAG, ENGINE_TAG)}
    running.compose("build", timeout=900)
    built = time.monotonic()
    for tag, before in previous.items():
        if before and before != image_id(tag):
            docker("image", "rm", before, check=False)  # vfs keeps every old build in full
    try:
        running.compose("up", "--detach", "--wait", timeout=UP_TIMEOUT)
    except BaseException:
        print(running.compose("logs", "--no-color", "--tail", "80", check=False))
        running.compose("down", "--volumes", check=False)
        raise
    print(f"docker tier: build {built - started:.0f} s, up --wait {time.monotonic() - built:.0f} s")
    yield running
    if running.containers():
        print(f"docker tier: service logs in {running.save_logs()}")
    running.compose("down", "--volumes", "--remove-orphans", check=False)
