"""Batch files (`/v1/files`): the record, the interface, and the embedded SQLite implementation.

A file's bytes are never held whole: they go in as a spooled file (moved into `files/` in
OCRVL_DATA_DIR) and come out in chunks. Every file expires (`expires_at`): the batch runner's
sweep removes it then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from app.store.database import Database

T = TypeVar("T")
CHUNK = 256 * 1024
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created_at);
CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at);
"""


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One stored file: whose it is, what it is for, how big."""

    id: str
    owner: str  # the API key's name, never the key
    filename: str
    purpose: str  # "batch" (uploaded), "batch_output" (written by a batch)
    bytes: int
    created_at: float
    expires_at: float

    def columns(self) -> dict[str, Any]:
        """The record as a dict of its columns."""
        return asdict(self)

    @classmethod
    def from_columns(cls, values: dict[str, Any]) -> FileRecord:
        """The record back from its columns (Redis gives strings)."""
        kinds = {"bytes": int, "created_at": float, "expires_at": float}
        kept: dict[str, Any] = {}
        for column in fields(cls):
            value = values[column.name]
            value = value.decode() if isinstance(value, bytes) else value
            kept[column.name] = kinds[column.name](value) if column.name in kinds else value
        return cls(**kept)


COLUMNS = [column.name for column in fields(FileRecord)]


class Files(Protocol):
    """Batch files of every key (SQLite: one gateway's data dir; Redis: every replica)."""

    where: str

    async def open(self) -> None:
        """Create or connect."""

    async def close(self) -> None:
        """Release connections."""

    async def put(self, record: FileRecord, path: Path) -> None:
        """Keep `record` and the file at `path` (consumed); one with its id is replaced."""

    async def get(self, file_id: str) -> FileRecord | None:
        """The file's record, or None."""

    async def listing(self, owner: str, limit: int, after: str | None) -> list[FileRecord]:
        """`owner`'s files, newest first, starting after file `after`."""

    def content(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, a chunk at a time (nothing when it is gone)."""

    async def copy(self, file_id: str, path: Path) -> bool:
        """Write the file's bytes to `path`; False when it is gone."""

    async def delete(self, file_id: str) -> None:
        """Remove the record and its bytes."""

    async def due(self, now: float) -> list[str]:
        """Ids of files past their `expires_at`."""


class SqliteFiles:
    """Files' records in `files.sqlite3`, their bytes in `files/`, in OCRVL_DATA_DIR."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = Path(data_dir) / "files"
        self._database = Database(Path(data_dir) / "files.sqlite3", "file store")
        self.where = f"sqlite ({self._database.path})"

    async def open(self) -> None:
        """Create the folder and the table."""

        def work() -> None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._database.connect(SCHEMA)

        await asyncio.to_thread(work)

    async def close(self) -> None:
        """Close the database."""
        await asyncio.to_thread(self._database.close)  # its lock may wait on a statement

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._database.run(work)

    async def put(self, record: FileRecord, path: Path) -> None:
        """Move the bytes in, then (re)write the record."""
        await asyncio.to_thread(shutil.move, path, self.folder / record.id)
        values = record.columns()
        marks = ", ".join("?" for _ in COLUMNS)
        sql = f"INSERT OR REPLACE INTO files ({', '.join(COLUMNS)}) VALUES ({marks})"  # noqa: S608
        await self._run(lambda db: db.execute(sql, [values[c] for c in COLUMNS]))

    async def get(self, file_id: str) -> FileRecord | None:
        """The record, or None."""
        sql = "SELECT * FROM files WHERE id = ?"
        row = await self._run(lambda db: db.execute(sql, (file_id,)).fetchone())
        return FileRecord.from_columns(dict(row)) if row is not None else None

    async def listing(self, owner: str, limit: int, after: str | None) -> list[FileRecord]:
        """`owner`'s files, newest first."""
        sql, args = "SELECT * FROM files WHERE owner = ?", [owner]
        if after is not None:
            sql += " AND (created_at, id) < (SELECT created_at, id FROM files WHERE id = ?)"
            args.append(after)
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        rows = await self._run(lambda db: db.execute(sql, [*args, limit]).fetchall())
        return [FileRecord.from_columns(dict(row)) for row in rows]

    async def content(self, file_id: str) -> AsyncIterator[bytes]:
        """The bytes from the file, read in a thread a chunk at a time."""
        try:
            handle = await asyncio.to_thread(open, self.folder / file_id, "rb")
        except FileNotFoundError:
            return
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            handle.close()

    async def copy(self, file_id: str, path: Path) -> bool:
        """Copy the bytes to `path`."""
        try:
            await asyncio.to_thread(shutil.copyfile, self.folder / file_id, path)
        except FileNotFoundError:
            return False
        return True

    async def delete(self, file_id: str) -> None:
        """Delete the bytes and the record."""
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(os.unlink, self.folder / file_id)
        await self._run(lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,)))

    async def due(self, now: float) -> list[str]:
        """Ids past their expiry."""
        sql = "SELECT id FROM files WHERE expires_at <= ? LIMIT 1000"
        rows = await self._run(lambda db: db.execute(sql, (now,)).fetchall())
        return [str(row[0]) for row in rows]
