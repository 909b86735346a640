"""The benchmark lab (bench/) stays at most a fifth of the code, counted as the lines of the
Python and shell files git tracks in app/, engine/, bench/ and scripts/ (docs/development.md,
"Source layout")."""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT

FOLDERS = ("app", "engine", "bench", "scripts")
LAB_SHARE = 0.20


def lines_of(folder: str) -> int:
    """Lines of the folder's tracked *.py and *.sh files (not a build's copies of them)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", f"{folder}/*.py", f"{folder}/*.sh"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    names = [name for name in listed.decode().split("\0") if name]
    return sum(len((ROOT / name).read_bytes().splitlines()) for name in names)


def test_the_lab_is_at_most_a_fifth_of_the_code() -> None:
    """A pass's one-off scripts leave with it (their results stay in bench/results/)."""
    lines = {folder: lines_of(folder) for folder in FOLDERS}
    share = lines["bench"] / sum(lines.values())
    assert share <= LAB_SHARE, f"bench/ is {share:.1%} of {lines}: at most {LAB_SHARE:.0%}"
