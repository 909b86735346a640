"""`make check`'s lock check (scripts/lockcheck.py): locks/ against pyproject.toml and the venv."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ENGINE_HERE, ROOT

pytestmark = pytest.mark.skipif(
    ENGINE_HERE, reason="the engine venv holds vLLM's pins, not the locks: `make test` runs this"
)
LOCKCHECK = ROOT / "scripts" / "lockcheck.py"


def lockcheck(root: Path) -> subprocess.CompletedProcess[str]:
    """scripts/lockcheck.py on `root`'s pyproject.toml and locks/, in this venv."""
    return subprocess.run(
        [sys.executable, str(LOCKCHECK), str(root)], capture_output=True, text=True, timeout=60
    )


def pinned(lock: str, name: str) -> str:
    """`name`'s version in the lock text."""
    found = re.search(rf"^{name}==(\S+)", lock, re.MULTILINE)
    assert found, name
    return found.group(1)


def test_the_checked_in_locks_agree_with_pyproject_and_this_venv() -> None:
    """The tree as committed passes, and says so."""
    result = lockcheck(ROOT)
    assert result.returncode == 0, result.stderr
    assert "agree" in result.stdout


def raise_fastapi(root: Path) -> str:
    path = root / "pyproject.toml"
    path.write_text(path.read_text().replace('"fastapi>=0.115"', '"fastapi>=999"'))
    return f"fastapi=={pinned((root / 'locks' / 'gateway.txt').read_text(), 'fastapi')} is outside"


def add_a_dependency(root: Path) -> str:
    path = root / "pyproject.toml"
    path.write_text(
        path.read_text().replace('    "httpx>=0.28",\n', '    "httpx>=0.28",\n    "rich>=13",\n')
    )
    return "locks/gateway.txt: rich>=13 is needed but not pinned"


def drop_a_dependency(root: Path) -> str:
    path = root / "pyproject.toml"
    text = path.read_text()
    path.write_text(re.sub(r'\n    "dnspython>=[^\n]*', "", text))
    return "locks/gateway.txt: dnspython is pinned but nothing in pyproject.toml needs it"


def strip_hashes(root: Path) -> str:
    path = root / "locks" / "build.txt"
    path.write_text(re.sub(r" \\\n\s+--hash=\S+", "", path.read_text()))
    return "locks/build.txt: setuptools=="


def move_a_runtime_pin_in_dev(root: Path) -> str:
    path = root / "locks" / "dev.txt"
    text = path.read_text()
    version = pinned(text, "fastapi")
    path.write_text(text.replace(f"fastapi=={version}", "fastapi==0.115.0"))
    return f"locks/dev.txt moves fastapi from {version} to 0.115.0"


@pytest.mark.parametrize(
    "edit",
    [raise_fastapi, add_a_dependency, drop_a_dependency, strip_hashes, move_a_runtime_pin_in_dev],
)
def test_a_disagreement_fails_the_check_naming_it(
    tmp_path: Path, edit: Callable[[Path], str]
) -> None:
    """Each kind of drift between pyproject.toml and locks/ exits 1 with a line naming it."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    assert lockcheck(tmp_path).returncode == 0  # the copy agrees before the edit
    expected = edit(tmp_path)
    result = lockcheck(tmp_path)
    assert result.returncode == 1
    assert expected in result.stderr
    assert "make lock" in result.stderr
