"""One SQLite connection for an embedded store: WAL, a busy timeout, one statement at a time.

The job store (app/store/sqlite.py), the batch files (app/store/files.py) and the usage totals
(app/usage/sqlite.py) each hold one `Database`. Their calls run in a thread (SQLite blocks) under
its lock, so the connection never runs two statements at once; WAL keeps readers beside the
writer, and the busy timeout makes another store or process on the same file wait, not fail.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Database:
    """The connection to `path`, once `connect` has run; `name` says whose it is in errors."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = Path(path)
        self.name = name
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        """Whether `connect` has run (and `close` not since)."""
        return self._db is not None

    def connect(
        self, schema: str, *, rows: bool = True, synchronous: str | None = None
    ) -> sqlite3.Connection:
        """Open the file (blocking: call it in a thread) and create `schema`; rows as
        `sqlite3.Row` unless `rows` is off, `PRAGMA synchronous` as given."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if rows:
            db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        if synchronous is not None:
            db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("PRAGMA busy_timeout=10000")  # another store or process writing: wait
        db.executescript(schema)
        self._db = db
        return db

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work(connection)` in a thread, under the lock; RuntimeError once closed."""

        def locked() -> T:
            with self._lock:
                if self._db is None:
                    raise RuntimeError(f"the {self.name} is closed")
                return work(self._db)

        return await asyncio.to_thread(locked)

    def close(self) -> None:
        """Close the connection (a no-op if it is not open)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
