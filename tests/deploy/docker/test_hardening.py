"""Hardening of the gateway and nginx, read from the running containers (inspect and exec)."""

from __future__ import annotations

import pytest

from tests.deploy.docker.conftest import GATEWAY_TAG, Stack, docker

# The first test of the tier builds the images and starts the stack (several minutes).
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]
MAX_GATEWAY_IMAGE_BYTES = 200_000_000


@pytest.mark.parametrize(("service", "uid"), [("gateway", "10001"), ("nginx", "101")])
def test_service_runs_locked_down(stack: Stack, service: str, uid: str) -> None:
    """Non-root, read-only root, no capabilities, no privilege gain, memory and pids capped."""
    host = stack.inspect(service)["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["Memory"] > 0
    assert host["PidsLimit"] > 0
    assert host["Privileged"] is False
    status = stack.exec(service, "cat", "/proc/1/status").stdout
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == [uid] * 4
    assert int(fields["CapEff"], 16) == 0
    assert int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"
    written = stack.exec(service, "sh", "-c", "echo x > /etc/hardening-probe")
    assert written.returncode != 0
    assert "Read-only file system" in written.stderr


@pytest.mark.parametrize(("service", "signal", "seconds"),
                         [("gateway", "SIGTERM", 630), ("nginx", "SIGQUIT", 680)])  # fmt: skip
def test_a_stop_gives_the_open_requests_time_to_end(
    stack: Stack, service: str, signal: str, seconds: int
) -> None:
    """The engine stops the gateway and nginx with the signal that drains them and waits the
    compose file's grace before SIGKILL, not Docker's 10 s."""
    config = stack.inspect(service)["Config"]
    assert config["StopTimeout"] == seconds
    assert config.get("StopSignal", "SIGTERM") == signal


def test_client_keys_come_from_the_secret_file_not_the_environment(stack: Stack) -> None:
    """docker inspect shows no client key; the keys file is the mounted secret, read-only."""
    config = stack.inspect("gateway")
    environment = "\n".join(config["Config"]["Env"])
    for key in stack.keys.values():
        assert key not in environment
    assert "OCRVL_API_KEYS=\n" in environment + "\n"
    assert "OCRVL_API_KEYS_FILE=/run/secrets/ocrvl-keys/api-keys.json" in environment
    # Settings passed on from .env only when set: the gateway's process does not see unset ones
    # (docker inspect lists their bare names), so its own defaults apply.
    process = stack.exec("gateway", "python", "-c", "import os; print(sorted(os.environ))").stdout
    assert "'OCRVL_KEY_RPM'" not in process
    assert "'OCRVL_AUTH'" in process
    mounts = {m["Destination"]: m for m in config["Mounts"]}
    assert mounts["/run/secrets/ocrvl-keys"]["RW"] is False
    readable = stack.exec("gateway", "cat", "/run/secrets/ocrvl-keys/api-keys.json")
    assert readable.returncode == 0, readable.stderr
    assert "ci-client" in readable.stdout
    assert stack.keys["ci-client"] not in readable.stdout  # only its hash is stored


def test_gateway_image_has_no_pip_compiler_sources_or_tests_and_is_small(stack: Stack) -> None:
    """The runtime image: the venv and nothing to build or install with; at most 200 MB."""
    probe = stack.exec("gateway", "python", "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == [
        "pip:absent", "ensurepip:absent", "tests:absent", "tools:[]", "files:[]"
    ]  # fmt: skip
    size = int(docker("image", "inspect", GATEWAY_TAG, "--format", "{{.Size}}"))
    print(f"gateway image: {size / 1e6:.0f} MB")
    assert size <= MAX_GATEWAY_IMAGE_BYTES


# The project's tests are neither importable nor on disk (third-party packages keep their own).
PROBE = """
import importlib.util, os, shutil
for module in ("pip", "ensurepip", "tests"):
    print(f"{module}:{'present' if importlib.util.find_spec(module) else 'absent'}")
tools = ["pip", "pip3", "gcc", "cc", "c++", "make", "ld", "as"]
print("tools:" + str([t for t in tools if shutil.which(t)]).replace(" ", ""))
found = []
for top in ("/opt", "/src", "/home", "/tmp"):
    for folder, _, names in os.walk(top):
        found += [os.path.join(folder, n) for n in names if n in ("conftest.py", "pyproject.toml")]
print("files:" + str(found).replace(" ", ""))
"""
