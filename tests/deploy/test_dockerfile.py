"""The gateway's Dockerfile, read with BuildKit's own parser (the `dockerfile` package).

These checks need no engine: the instructions, the build context they need, and the
HEALTHCHECK command run against a real gateway. The docker tier (tests/deploy/docker/) builds
the image and checks the result in a running container.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from typing import TYPE_CHECKING

import dockerfile
import pytest

from tests.deploy.compose import ROOT

if TYPE_CHECKING:
    from tests.conftest import GatewayServer

COMMANDS = dockerfile.parse_file(str(ROOT / "Dockerfile"))


def final_stage() -> list[dockerfile.Command]:
    starts = [i for i, command in enumerate(COMMANDS) if command.cmd == "FROM"]
    return list(COMMANDS[starts[-1] :])


def only(stage: list[dockerfile.Command], instruction: str) -> dockerfile.Command:
    found = [command for command in stage if command.cmd == instruction]
    assert len(found) == 1, f"{instruction}: {found}"
    return found[0]


def test_runtime_stage_runs_ocrvl_serve_as_a_non_root_user() -> None:
    """The last stage drops root before its CMD, which is `ocrvl serve` in exec form."""
    stage = final_stage()
    user = only(stage, "USER")
    assert user.value[0] not in ("root", "0")
    cmd = only(stage, "CMD")
    assert cmd.json
    assert cmd.value == ("ocrvl", "serve")
    assert stage.index(user) < stage.index(cmd)
    env = dict(zip(only(stage, "ENV").value[::2], only(stage, "ENV").value[1::2], strict=True))
    assert env["OCRVL_HOST"] == "0.0.0.0"  # noqa: S104 (inside the container's own network)


def build_args() -> dict[str, str]:
    """The Dockerfile's ARGs and their defaults."""
    args = [command.value[0] for command in COMMANDS if command.cmd == "ARG"]
    return dict(arg.split("=", 1) for arg in args)


def test_base_image_is_a_slim_python_matching_requires_python() -> None:
    """Both stages start from the same slim CPython, one the project supports."""
    image = build_args()["PYTHON_IMAGE"]
    assert image.startswith("python:")
    assert "-slim" in image
    version = image.removeprefix("python:").split("-")[0]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={version}"
    assert [c.value[0] for c in COMMANDS if c.cmd == "FROM"] == ["${PYTHON_IMAGE}"] * 2


def test_only_runtime_dependencies_are_installed() -> None:
    """The build installs locks/gateway.txt's pins and the locked setuptools, hashes checked
    (no dev group, no extras), from an index or from wheelhouse/ alone with PIP_NO_INDEX=1,
    then the project with nothing more, and leaves no pip behind; the runtime stage copies
    only the venv."""
    assert build_args()["PIP_NO_INDEX"] == "0"
    runs = [command.value[0] for command in COMMANDS if command.cmd == "RUN"]
    installs = [" ".join(run.split()) for run in runs if "pip install" in run]
    assert installs == [
        "python -m venv /opt/ocrvl"
        " && /opt/ocrvl/bin/pip install --no-compile --require-hashes"
        " -r /src/locks/gateway.txt -r /src/locks/build.txt"
        " && /opt/ocrvl/bin/pip install --no-compile --no-deps --no-build-isolation /src"
        " && /opt/ocrvl/bin/pip uninstall --yes pip setuptools"
    ]
    copied = only(final_stage(), "COPY")
    assert copied.flags == ("--from=build",)
    assert copied.value == ("/opt/ocrvl", "/opt/ocrvl")


def _pattern(rule: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: `**/` any folders, `*` and `?` within one name."""
    regex, index = "", 0
    while index < len(rule):
        if rule.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif rule[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif rule[index] == "?":
            regex, index = regex + "[^/]", index + 1
        else:
            regex, index = regex + re.escape(rule[index]), index + 1
    return re.compile(regex)


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (the last matching rule wins;
    a rule matching a parent folder matches everything in it)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        rule = line.strip()
        if not rule or rule.startswith("#"):
            continue
        pattern = _pattern(rule.removeprefix("!").strip("/"))
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            verdict = not rule.startswith("!")
    return verdict


def test_build_context_holds_the_project_and_wheelhouse_only() -> None:
    """The one COPY takes the whole context, which .dockerignore narrows to the package's
    sources, locks/ and wheelhouse/; tests, venvs, caches and keys stay out."""
    sources = [
        source
        for command in COMMANDS
        if command.cmd == "COPY" and not command.flags
        for source in command.value[:-1]
    ]
    assert sources == ["."]
    kept = ("pyproject.toml", "README.md", "app/main.py", "locks/gateway.txt", "locks/build.txt",
            "wheelhouse/README.md")  # fmt: skip
    for kept_in in kept:
        assert (ROOT / kept_in).exists(), kept_in
        assert not ignored(kept_in), kept_in
    kept_out = (".venv", ".git", "tests/conftest.py", ".cache/tiny-model", "app/__pycache__",
                "secrets/api-keys.json", "docs/deploy.md", ".env")  # fmt: skip
    for path in kept_out:
        assert ignored(path), path


def healthcheck_command() -> list[str]:
    healthcheck = only(final_stage(), "HEALTHCHECK")
    assert healthcheck.json
    assert healthcheck.value[0] == "CMD"
    command = list(healthcheck.value[1:])
    assert command[0] == "python"
    return [sys.executable, *command[1:]]


@pytest.mark.vllm
def test_healthcheck_command_passes_on_a_live_gateway_and_fails_on_a_dead_port(
    gateway: GatewayServer,
) -> None:
    """The image's HEALTHCHECK, run as written against the real gateway's /health."""
    port = gateway.url.rsplit(":", 1)[1]
    live = subprocess.run(
        healthcheck_command(),
        env={"OCRVL_PORT": port},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert live.returncode == 0, live.stderr
    from tests.support.servers import free_port  # noqa: PLC0415

    dead = subprocess.run(
        healthcheck_command(), env={"OCRVL_PORT": str(free_port())}, capture_output=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert dead.returncode != 0
