"""The embedded store: `jobs.sqlite3` and a `documents/` folder in OCRVL_DATA_DIR.

Batches (app/batches/) keep the same records in their own tables, folder and lock (`BATCHES`).

One gateway owns a data dir: it holds an exclusive lock on `ocrvl.lock` while it runs, and the
gateway that takes the lock (the first to start after a crash, `kill -9` included: the kernel
drops a dead process's lock) takes over every running job at once, instead of waiting for the
dead one's lease to run out. Calls run in a thread (SQLite blocks); WAL keeps readers beside
the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from app.store.base import PAGE_CHUNK, RUNNING, Job, PageRecord, encoded
from app.store.database import Database

T = TypeVar("T")
COLUMNS = [column.name for column in fields(Job)]
SCHEMA = """
CREATE TABLE IF NOT EXISTS {jobs} (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, expires_at REAL, error TEXT, holder TEXT,
    lease_until REAL NOT NULL DEFAULT 0, pages_total INTEGER NOT NULL,
    pages_done INTEGER NOT NULL DEFAULT 0, pages_failed INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    document_bytes INTEGER NOT NULL DEFAULT 0, spec TEXT NOT NULL, extra TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS {jobs}_by_owner ON {jobs} (owner, created_at);
CREATE INDEX IF NOT EXISTS {jobs}_by_status ON {jobs} (status, created_at);
CREATE INDEX IF NOT EXISTS {jobs}_by_expiry ON {jobs} (expires_at);
CREATE TABLE IF NOT EXISTS {pages} (
    job_id TEXT NOT NULL, number INTEGER NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (job_id, number)
) WITHOUT ROWID;
"""
ACTIVE_SQL = "('queued', 'running')"


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one kind of record lives in the data dir: its tables, folder and lock file."""

    jobs: str = "jobs"
    pages: str = "pages"
    documents: str = "documents"
    lock: str = "ocrvl.lock"


BATCHES = Layout("batches", "batch_lines", "batch-inputs", "batches.lock")


class SqliteStore:
    """Jobs in one SQLite file, documents as files beside it (batches: their own `layout`)."""

    def __init__(self, data_dir: Path, layout: Layout = Layout()) -> None:
        self.data_dir = Path(data_dir)
        self.layout = layout
        self.documents = self.data_dir / layout.documents
        self._database = Database(self.data_dir / "jobs.sqlite3", "job store")
        self.where = f"sqlite ({self._database.path})"
        self._owner_lock: int | None = None

    async def open(self) -> None:
        """Create the folder and tables; take over a dead gateway's running jobs."""
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self.documents.mkdir(parents=True, exist_ok=True)
        db = self._database.connect(SCHEMA.format(jobs=self.layout.jobs, pages=self.layout.pages))
        fd = os.open(self.data_dir / self.layout.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another live gateway holds it: leases decide
            os.close(fd)
            return
        self._owner_lock = fd
        db.execute(f"UPDATE {self.layout.jobs} SET lease_until = 0 WHERE status = 'running'")  # noqa: S608

    async def close(self) -> None:
        """Close the database and let go of the data dir."""
        await asyncio.to_thread(self._database.close)  # its lock may wait on a statement
        if self._owner_lock is not None:
            os.close(self._owner_lock)
            self._owner_lock = None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._database.run(work)

    def _sql(self, text: str) -> str:
        """`text` with {J} and {P} as this layout's job and page tables."""
        return text.format(J=self.layout.jobs, P=self.layout.pages)

    def _path(self, job_id: str) -> Path:
        return self.documents / job_id

    async def create(self, job: Job, document: Path) -> None:
        """Insert the record, then move the document in (same folder: a rename)."""
        await asyncio.to_thread(shutil.move, document, self._path(job.id))
        values = job.columns()
        names = ", ".join(COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        sql = f"INSERT INTO {self.layout.jobs} ({names}) VALUES ({marks})"  # noqa: S608 (our own names)
        await self._run(lambda db: db.execute(sql, [values[c] for c in COLUMNS]))

    async def get(self, job_id: str) -> Job | None:
        """The job, or None."""
        row = await self._run(
            lambda db: db.execute(self._sql("SELECT * FROM {J} WHERE id = ?"), (job_id,)).fetchone()
        )
        return Job.from_columns(dict(row)) if row is not None else None

    async def listing(self, owner: str, limit: int, after: str | None) -> list[Job]:
        """`owner`'s jobs, newest first."""
        sql = self._sql("SELECT * FROM {J} WHERE owner = ?")
        args: list[Any] = [owner]
        if after is not None:
            sql += self._sql(
                " AND (created_at, id) < (SELECT created_at, id FROM {J} WHERE id = ?)"
            )
            args.append(after)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        args.append(limit)
        rows = await self._run(lambda db: db.execute(sql, args).fetchall())
        return [Job.from_columns(dict(row)) for row in rows]

    async def active(self, owner: str) -> int:
        """`owner`'s jobs queued or running."""
        sql = f"SELECT count(*) FROM {self.layout.jobs} WHERE owner = ? AND status IN {ACTIVE_SQL}"  # noqa: S608
        count: int = await self._run(lambda db: db.execute(sql, (owner,)).fetchone()[0])
        return count

    async def stored_bytes(self) -> int:
        """Bytes of the documents kept."""
        sql = self._sql("SELECT coalesce(sum(document_bytes), 0) FROM {J}")
        total: int = await self._run(lambda db: db.execute(sql).fetchone()[0])
        return total

    async def claim(self, holder: str, now: float, lease: float) -> Job | None:
        """The oldest claimable job, leased to `holder`."""
        sql = self._sql("""
            UPDATE {J} SET status = 'running', holder = ?, lease_until = ?,
                started_at = coalesce(started_at, ?)
            WHERE id = (
                SELECT id FROM {J}
                WHERE status = 'queued' OR (status = 'running' AND lease_until < ?)
                ORDER BY created_at LIMIT 1
            ) AND (status = 'queued' OR lease_until < ?)
            RETURNING *
        """)
        row = await self._run(
            lambda db: db.execute(sql, (holder, now + lease, now, now, now)).fetchone()
        )
        return Job.from_columns(dict(row)) if row is not None else None

    async def renew(self, job_id: str, holder: str, until: float) -> bool:
        """Extend the lease while `holder` has it."""
        sql = self._sql(
            "UPDATE {J} SET lease_until = ? WHERE id = ? AND holder = ? AND status = 'running'"
        )
        changed = await self._run(lambda db: db.execute(sql, (until, job_id, holder)).rowcount)
        return changed == 1

    async def release(self, job_id: str, holder: str) -> None:
        """Give the lease up."""
        sql = self._sql(
            "UPDATE {J} SET lease_until = 0 WHERE id = ? AND holder = ? AND status = 'running'"
        )
        await self._run(lambda db: db.execute(sql, (job_id, holder)))

    async def transition(
        self, job_id: str, before: tuple[str, ...], status: str, changes: dict[str, Any]
    ) -> bool:
        """Compare-and-set the status, with `changes`."""
        names = [name for name in changes if name in COLUMNS]
        assigned = "".join(f", {name} = ?" for name in names)
        marks = ", ".join("?" for _ in before)
        table = self.layout.jobs
        sql = f"UPDATE {table} SET status = ?{assigned} WHERE id = ? AND status IN ({marks})"  # noqa: S608
        args = [status, *(encoded(name, changes[name]) for name in names), job_id, *before]
        changed = await self._run(lambda db: db.execute(sql, args).rowcount)
        return changed == 1

    async def add_page(self, job_id: str, page: PageRecord) -> bool:
        """Insert once, count once, only while the job runs."""

        def work(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                running = db.execute(
                    self._sql("SELECT 1 FROM {J} WHERE id = ? AND status = ?"), (job_id, RUNNING)
                ).fetchone()
                if running is None:
                    return False
                inserted = db.execute(
                    self._sql("INSERT OR IGNORE INTO {P} (job_id, number, body) VALUES (?, ?, ?)"),
                    (job_id, page.number, page.body),
                ).rowcount
                if inserted:
                    db.execute(
                        self._sql(
                            "UPDATE {J} SET pages_done = pages_done + 1, pages_failed = "
                            "pages_failed + ?, prompt_tokens = prompt_tokens + ?, "
                            "completion_tokens = completion_tokens + ? WHERE id = ?"
                        ),
                        (int(page.failed), page.prompt_tokens, page.completion_tokens, job_id),
                    )
                return bool(inserted)

        return await self._run(work)

    async def pages(self, job_id: str) -> list[bytes]:
        """The pages kept, in order."""
        sql = self._sql("SELECT body FROM {P} WHERE job_id = ? ORDER BY number")
        rows = await self._run(lambda db: db.execute(sql, (job_id,)).fetchall())
        return [bytes(row[0]) for row in rows]

    async def page_chunks(self, job_id: str, size: int = PAGE_CHUNK) -> AsyncIterator[list[bytes]]:
        """The pages kept, in order, `size` rows a query (by number: no offset to skip over)."""
        sql = self._sql(
            "SELECT number, body FROM {P} WHERE job_id = ? AND number > ? ORDER BY number LIMIT ?"
        )
        after = 0
        while True:
            args = (job_id, after, size)
            rows: list[Any] = await self._run(lambda db: db.execute(sql, args).fetchall())  # noqa: B023 (awaited at once)
            if not rows:
                return
            after = int(rows[-1][0])
            yield [bytes(row[1]) for row in rows]

    async def page_numbers(self, job_id: str) -> set[int]:
        """Numbers of the pages kept."""
        sql = self._sql("SELECT number FROM {P} WHERE job_id = ?")
        rows = await self._run(lambda db: db.execute(sql, (job_id,)).fetchall())
        return {int(row[0]) for row in rows}

    async def document(self, job_id: str, folder: Path) -> Path | None:
        """The document's own file (no copy)."""
        path = self._path(job_id)
        return path if path.exists() else None

    async def drop_document(self, job_id: str) -> None:
        """Delete the file; it no longer counts in the stored bytes."""
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, self._path(job_id))
        sql = self._sql("UPDATE {J} SET document_bytes = 0 WHERE id = ?")
        await self._run(lambda db: db.execute(sql, (job_id,)))

    async def drop_pages(self, job_id: str) -> None:
        """Delete the page results."""
        await self._run(
            lambda db: db.execute(self._sql("DELETE FROM {P} WHERE job_id = ?"), (job_id,))
        )

    async def delete(self, job_id: str) -> None:
        """Delete everything of the job."""
        await self.drop_document(job_id)
        await self.drop_pages(job_id)
        await self._run(lambda db: db.execute(self._sql("DELETE FROM {J} WHERE id = ?"), (job_id,)))

    async def due(self, now: float) -> list[Job]:
        """Jobs past their `expires_at`."""
        sql = self._sql(
            "SELECT * FROM {J} WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT 1000"
        )
        rows = await self._run(lambda db: db.execute(sql, (now,)).fetchall())
        return [Job.from_columns(dict(row)) for row in rows]


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT (ROLLBACK on error): the write lock from the start."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
