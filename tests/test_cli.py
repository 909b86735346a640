"""The `ocrvl` command line, run as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OCRVL = str(Path(sys.executable).parent / "ocrvl")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ocrvl ARGS` with a clean OCRVL_* environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    return subprocess.run(
        [OCRVL, *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=60
    )


def test_help_lists_the_commands() -> None:
    """`ocrvl --help` names serve, keys and profile."""
    result = run("--help")
    assert result.returncode == 0
    for command in ("serve", "keys", "profile"):
        assert command in result.stdout


def test_serve_without_keys_refuses_with_guidance() -> None:
    """`ocrvl serve` with no key configured exits 2 and says which settings to set."""
    result = run("serve", "--port", "1", env={"OCRVL_BACKENDS": "http://127.0.0.1:8118"})
    assert result.returncode == 2
    assert "OCRVL_API_KEYS" in result.stderr
    assert "OCRVL_API_KEYS_FILE" in result.stderr
    assert "OCRVL_AUTH=off" in result.stderr


def test_keys_create_prints_the_key_once_and_stores_its_hash(tmp_path: Path) -> None:
    """The key goes to stdout alone; the file has only its hash."""
    path = tmp_path / "keys.json"
    result = run("keys", "create", "alice", env={"OCRVL_API_KEYS_FILE": str(path)})
    assert result.returncode == 0
    key = result.stdout.strip()
    assert key.startswith("sk-ocrvl-")
    assert key not in path.read_text()
    assert key not in result.stderr
    assert json.loads(path.read_text())["keys"][0]["name"] == "alice"
    again = run("keys", "create", "alice", "--file", str(path))
    assert again.returncode == 2
    assert "exists already" in again.stderr
