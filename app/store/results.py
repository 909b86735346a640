"""The results cache's storage: a page's answer by its cache key, with a TTL and a size cap.

The key (app/documents/cache.py makes it) is a SHA-256 of everything that decides the answer,
the API key's name included, so an entry is only ever found by the key that wrote it. Entries
are kept from when they were written for the TTL (a read does not extend it); past the size
cap, the oldest written go first. `sweep` holds both, every OCRVL_CACHE_SWEEP_INTERVAL seconds:
between sweeps the store may pass the cap by what was written meanwhile.

    ResultsCache   the interface (both stores share it)
    SqliteResults  a table in the data dir's `jobs.sqlite3`, beside jobs and usage
    RedisResults   (app/store/redisresults.py) in the job store's Redis, shared by replicas
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from app.store.database import Database

T = TypeVar("T")
FILE_NAME = "jobs.sqlite3"  # the job store's file: one database per data dir
SCHEMA = """
CREATE TABLE IF NOT EXISTS results_cache (
    key TEXT PRIMARY KEY, body BLOB NOT NULL, bytes INTEGER NOT NULL, written_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS results_cache_by_age ON results_cache (written_at);
"""


@dataclass(frozen=True, slots=True)
class CacheSize:
    """What the cache holds now."""

    entries: int
    bytes: int


class ResultsCache(Protocol):
    """Page answers by cache key; safe from several gateways at once (one data dir, or one
    Redis)."""

    where: str  # for logs, never a password

    async def open(self) -> None:
        """Connect or create."""

    async def close(self) -> None:
        """Release connections."""

    async def get(self, key: str, now: float) -> bytes | None:
        """The answer kept under `key`, unless none or older than the TTL."""

    async def put(self, key: str, body: bytes, now: float) -> None:
        """Keep `body` under `key` (written at `now`; one kept before is replaced)."""

    async def sweep(self, now: float) -> CacheSize:
        """Remove entries past the TTL, then the oldest while over the cap; the size after."""


class SqliteResults:
    """Entries in one table of the data dir's database."""

    def __init__(self, data_dir: Path, ttl: float, max_bytes: int) -> None:
        self._database = Database(Path(data_dir) / FILE_NAME, "results cache")
        self.where = f"sqlite ({self._database.path})"
        self.ttl = ttl
        self.max_bytes = max_bytes

    async def open(self) -> None:
        """Create the folder and the table."""
        await asyncio.to_thread(self._database.connect, SCHEMA, rows=False, synchronous="NORMAL")

    async def close(self) -> None:
        """Close the connection."""
        await asyncio.to_thread(self._database.close)  # its lock may wait on a statement

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._database.run(work)

    async def get(self, key: str, now: float) -> bytes | None:
        """The body, if written within the TTL."""
        sql = "SELECT body FROM results_cache WHERE key = ? AND written_at > ?"
        row = await self._run(lambda db: db.execute(sql, (key, now - self.ttl)).fetchone())
        return bytes(row[0]) if row is not None else None

    async def put(self, key: str, body: bytes, now: float) -> None:
        """Insert or replace."""
        sql = "INSERT OR REPLACE INTO results_cache (key, body, bytes, written_at) "
        sql += "VALUES (?, ?, ?, ?)"
        await self._run(lambda db: db.execute(sql, (key, body, len(body), now)))

    async def sweep(self, now: float) -> CacheSize:
        """The expired first, then the oldest in batches until under the cap."""

        def work(db: sqlite3.Connection) -> CacheSize:
            db.execute("DELETE FROM results_cache WHERE written_at <= ?", (now - self.ttl,))
            entries, size = db.execute(
                "SELECT count(*), coalesce(sum(bytes), 0) FROM results_cache"
            ).fetchone()
            excess, dropped = size - self.max_bytes, []
            rows = db.execute("SELECT key, bytes FROM results_cache ORDER BY written_at")
            while excess > 0 and (row := rows.fetchone()) is not None:
                dropped.append((row[0],))
                excess -= row[1]
                size -= row[1]
            rows.close()
            db.executemany("DELETE FROM results_cache WHERE key = ?", dropped)
            return CacheSize(int(entries) - len(dropped), int(size))

        return await self._run(work)
