"""The `ocrvl` command line, run as users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OCRVL = str(Path(sys.executable).parent / "ocrvl")


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`ocrvl ARGS` with a clean OCRVL_* environment (in `cwd`, default the current folder)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    environment = {**base, **(env or {})}
    return subprocess.run(
        [OCRVL, *args], capture_output=True, text=True, env=environment, cwd=cwd, timeout=60
    )


def test_help_lists_the_commands() -> None:
    """`ocrvl --help` names serve, keys and profile."""
    result = run("--help")
    assert result.returncode == 0
    for command in ("serve", "keys", "profile"):
        assert command in result.stdout


def test_serve_without_keys_refuses_with_guidance(tmp_path: Path) -> None:
    """`ocrvl serve` with no key configured exits 2 and says which settings to set. Run in an
    empty folder: in the repository, the secrets/api-keys.json that README's `ocrvl keys create`
    writes would be read, and the gateway would start."""
    result = run(
        "serve", "--port", "1", env={"OCRVL_BACKENDS": "http://127.0.0.1:8118"}, cwd=tmp_path
    )
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


def test_keys_limits_are_created_edited_and_listed(tmp_path: Path) -> None:
    """`keys create --rpm/--concurrency`, `keys set` (a number, 0 or `default`), `keys list`."""
    path = str(tmp_path / "keys.json")
    created = run("keys", "create", "team", "--rpm", "600", "--concurrency", "32", "--file", path)
    assert created.returncode == 0, created.stderr
    assert run("keys", "set", "team", "--rpm", "0", "--file", path).returncode == 0
    assert run("keys", "set", "team", "--concurrency", "default", "--file", path).returncode == 0
    listing = run("keys", "list", "--file", path)
    shown = ["team", "unlimited", "default", "none", "none"]  # the budgets: none set
    assert listing.stdout.splitlines()[1].split() == shown
    assert json.loads(Path(path).read_text())["keys"][0]["sha256"] not in listing.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("set", "team"), "give --rpm, --concurrency, --pages-per-day or --pages-per-month"),
        (("set", "team", "--rpm", "-5"), "expected a number >= 0 or 'default'"),
        (("create", "new", "--rpm", "default"), "expected a number >= 0"),
        (("set", "ghost", "--rpm", "1"), "no key named 'ghost'"),
    ],
)
def test_keys_limit_mistakes_are_refused(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """Bad limit arguments exit 2 with a message saying what is expected."""
    path = str(tmp_path / "keys.json")
    run("keys", "create", "team", "--file", path)
    result = run("keys", *args, "--file", path)
    assert result.returncode == 2
    assert message in result.stderr


def test_ocr_out_into_a_missing_folder_is_refused_clearly(tmp_path: Path) -> None:
    """`ocrvl ocr --out` into a folder that does not exist exits 2 naming the folder, before
    any request (no raw Errno)."""
    page = tmp_path / "page.png"
    page.write_bytes(b"\x89PNG\r\n\x1a\n")
    missing = tmp_path / "nowhere"
    result = run("ocr", str(page), "--out", str(missing / "page.md"), "--url", "http://127.0.0.1:9")
    assert result.returncode == 2
    assert f"the folder {missing} does not exist" in result.stderr
    assert "Errno" not in result.stderr
