"""Usage totals in the job store's SQLite file (OCRVL_DATA_DIR/jobs.sqlite3), a table of their own.

A connection of its own beside the job store's, in WAL mode with `synchronous=NORMAL`: a commit
survives the gateway's death (`kill -9`), only a power cut may lose the last ones. Budgets are
checked and added in one `BEGIN IMMEDIATE` transaction, so processes on one data dir share them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from app.store.database import Database
from app.usage.base import Budget, Counts, DayTotals, Refusal, month_days

T = TypeVar("T")
FILE_NAME = "jobs.sqlite3"  # the job store's file (app/store/sqlite.py): one database per dir
SCHEMA = """
CREATE TABLE IF NOT EXISTS usage_days (
    key TEXT NOT NULL, day TEXT NOT NULL, requests INTEGER NOT NULL DEFAULT 0,
    pages INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, cached_pages INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_by_day ON usage_days (day);
"""
ADD = """
INSERT INTO usage_days (key, day, requests, pages, prompt_tokens, completion_tokens,
    cached_pages)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key, day) DO UPDATE SET requests = requests + excluded.requests,
    pages = pages + excluded.pages, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cached_pages = cached_pages + excluded.cached_pages
"""
CACHED_COLUMN = "ALTER TABLE usage_days ADD COLUMN cached_pages INTEGER NOT NULL DEFAULT 0"
PAGES = "SELECT coalesce(sum(pages), 0) FROM usage_days WHERE key = ? AND day BETWEEN ? AND ?"


class SqliteUsage:
    """Per key and day totals in one table of the data dir's database."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self.where = f"sqlite ({self.path})"
        self._database = Database(self.path, "usage store")

    async def open(self) -> None:
        """Create the folder and the table."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        if self._database.connected:  # opened already (the meter tries again after a failure)
            return
        db = self._database.connect(SCHEMA, rows=False, synchronous="NORMAL")
        columns = {row[1] for row in db.execute("PRAGMA table_info(usage_days)")}
        if "cached_pages" not in columns:  # a data dir from before the results cache
            db.execute(CACHED_COLUMN)

    async def close(self) -> None:
        """Close the connection."""
        await asyncio.to_thread(self._database.close)  # its lock may wait on a statement

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._database.run(work)

    async def add(self, batch: dict[tuple[str, str], Counts]) -> None:
        """One transaction for the whole batch."""
        rows = [
            (key, day, *counts.values(), counts.cached_pages)
            for (key, day), counts in batch.items()
        ]

        def work(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(ADD, rows)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        await self._run(work)

    async def reserve(self, key: str, day: str, pages: int, budget: Budget) -> Refusal | None:
        """Check the day's and the month's pages and add `pages`, in one write transaction."""

        def work(db: sqlite3.Connection) -> Refusal | None:
            db.execute("BEGIN IMMEDIATE")
            try:
                refusal = _over(db, key, day, pages, budget)
                if refusal is None:
                    db.execute(ADD, (key, day, 0, pages, 0, 0, 0))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return refusal

        return await self._run(work)

    async def unreserve(self, key: str, day: str, pages: int) -> None:
        """Subtract the pages."""
        await self._run(lambda db: db.execute(ADD, (key, day, 0, -pages, 0, 0, 0)))

    async def totals(self, key: str | None, start: str, end: str) -> list[DayTotals]:
        """Rows of the days asked, by key then day."""
        sql = "SELECT key, day, requests, pages, prompt_tokens, completion_tokens, cached_pages "
        sql += "FROM usage_days WHERE day BETWEEN ? AND ?"
        args = [start, end]
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        sql += " ORDER BY key, day"
        rows = await self._run(lambda db: db.execute(sql, args).fetchall())
        return [DayTotals(row[0], row[1], Counts(*row[2:7])) for row in rows]


def _over(db: sqlite3.Connection, key: str, day: str, pages: int, budget: Budget) -> Refusal | None:
    """The budget `pages` more would pass, if any (the day's first, then the month's)."""
    for period, limit, since in (
        ("day", budget.pages_per_day, day),
        ("month", budget.pages_per_month, month_days(day)[0]),
    ):
        if limit:
            used = int(db.execute(PAGES, (key, since, day)).fetchone()[0])
            if used + pages > limit:
                return Refusal(period, limit, used)
    return None
