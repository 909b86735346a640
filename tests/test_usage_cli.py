"""`ocrvl keys usage` and the budget flags of `ocrvl keys create/set`, run as the operator would."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

from app.usage.base import Counts
from app.usage.sqlite import SqliteUsage

OCRVL = [sys.executable, "-m", "app.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """`ocrvl ARGS`, its output captured."""
    return subprocess.run([*OCRVL, *args], capture_output=True, text=True, timeout=60, check=False)


def filled(folder: Path) -> Path:
    """A data dir whose store holds two keys' usage on two days."""

    async def fill() -> None:
        store = SqliteUsage(folder)
        await store.open()
        await store.add(
            {
                ("team-a", "2026-11-30"): Counts(2, 3, 300, 30),
                ("team-a", "2026-12-01"): Counts(1, 1, 100, 10),
                ("team-b", "2026-12-01"): Counts(5, 5, 500, 50),
            }
        )
        await store.close()

    asyncio.run(fill())
    return folder


def test_every_keys_usage_is_listed_with_totals(tmp_path: Path) -> None:
    """The table: a line per key and day, then the key's total."""
    data = filled(tmp_path)
    shown = run("keys", "usage", "--since", "2026-11-01", "--until", "2026-12-31",
                "--data-dir", str(data))  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()[1:]]
    assert lines == [
        ["team-a", "2026-11-30", "2", "3", "300", "30", "0"],
        ["team-a", "2026-12-01", "1", "1", "100", "10", "0"],
        ["team-a", "total", "3", "4", "400", "40", "0"],
        ["team-b", "2026-12-01", "5", "5", "500", "50", "0"],
        ["team-b", "total", "5", "5", "500", "50", "0"],
    ]


def test_one_keys_usage_as_csv_from_a_day_on(tmp_path: Path) -> None:
    """`NAME --since DAY --csv`: that key's rows from that day, with total_tokens."""
    data = filled(tmp_path)
    shown = run("keys", "usage", "team-a", "--since", "2026-12-01", "--until", "2026-12-31",
                "--csv", "--data-dir", str(data))  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert list(csv.DictReader(io.StringIO(shown.stdout))) == [
        {"key": "team-a", "date": "2026-12-01", "requests": "1", "pages": "1",
         "prompt_tokens": "100", "completion_tokens": "10", "total_tokens": "110",
         "cached_pages": "0"},
    ]  # fmt: skip


def test_no_store_or_a_bad_date_is_said_plainly(tmp_path: Path) -> None:
    """A data dir without a store, a date that is none: exit 2 and one line saying so."""
    missing = run("keys", "usage", "--data-dir", str(tmp_path / "nothing"))
    assert missing.returncode == 2
    assert "no usage store at" in missing.stderr
    bad = run("keys", "usage", "--since", "12/01/2026", "--data-dir", str(tmp_path))
    assert bad.returncode == 2
    assert "expected a date as YYYY-MM-DD" in bad.stderr


def test_budgets_are_created_changed_cleared_and_listed(tmp_path: Path) -> None:
    """`--pages-per-day/--pages-per-month` on create and set (0 or default: none), in the list."""
    path = str(tmp_path / "keys.json")
    assert run("keys", "create", "team", "--pages-per-day", "20", "--file", path).returncode == 0
    assert run("keys", "set", "team", "--pages-per-month", "500", "--file", path).returncode == 0
    listed = run("keys", "list", "--file", path).stdout.splitlines()[1].split()
    assert listed[-2:] == ["20", "500"]
    assert run("keys", "set", "team", "--pages-per-day", "default", "--file", path).returncode == 0
    entry = json.loads(Path(path).read_text())["keys"][0]
    assert "pages_per_day" not in entry
    assert entry["pages_per_month"] == 500
