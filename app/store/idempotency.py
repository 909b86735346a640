"""Idempotency records (the `Idempotency-Key` of a submission): the first answer, per key name.

A record is claimed (pending) before the submission is accepted and completed with its answer
after; a duplicate finds the pending one (409) or the answer (replayed). Records are kept
OCRVL_IDEMPOTENCY_TTL from their claim. A pending record older than `PENDING_LIMIT` is one a
gateway died holding: the next claim takes it over.

    SqliteIdempotency  a table in the data dir's `jobs.sqlite3`
    RedisIdempotency   a hash per record in the job store's Redis (EXPIRE: the TTL)
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from app.quotas.link import redacted, store_client
from app.store.database import Database
from app.store.redisdb import answering

PENDING_LIMIT = 600.0  # seconds a submission may take to be accepted (a 200 MB upload's store)
SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, pending INTEGER NOT NULL,
    status INTEGER NOT NULL DEFAULT 0, body BLOB, headers TEXT, created_at REAL NOT NULL,
    PRIMARY KEY (owner, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_by_age ON idempotency (created_at);
"""


@dataclass(frozen=True, slots=True)
class Record:
    """A claimed key: which request claimed it, and its answer once there is one."""

    fingerprint: str
    pending: bool
    status: int = 0
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class Idempotency(Protocol):
    """Records by (key name, route and Idempotency-Key); safe from several gateways at once."""

    where: str

    async def open(self) -> None:
        """Connect or create."""

    async def close(self) -> None:
        """Release connections."""

    async def claim(self, owner: str, key: str, fingerprint: str, now: float) -> Record | None:
        """None once claimed for this request (pending); else the record that holds the key."""

    async def complete(self, owner: str, key: str, answer: Record) -> None:
        """Keep the answer of the claimed key."""

    async def forget(self, owner: str, key: str) -> None:
        """Drop a claim whose submission failed: the key may be used again."""


class SqliteIdempotency:
    """Records in one table of the data dir's database."""

    def __init__(self, data_dir: Path, ttl: float) -> None:
        self._database = Database(Path(data_dir) / "jobs.sqlite3", "idempotency store")
        self.where = f"sqlite ({self._database.path})"
        self.ttl = ttl

    async def open(self) -> None:
        """Create the table."""
        await asyncio.to_thread(self._database.connect, SCHEMA, rows=False)

    async def close(self) -> None:
        """Close the connection."""
        await asyncio.to_thread(self._database.close)  # its lock may wait on a statement

    async def claim(self, owner: str, key: str, fingerprint: str, now: float) -> Record | None:
        """Read and claim in one write transaction (a duplicate on another process waits)."""

        def work(db: sqlite3.Connection) -> Record | None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM idempotency WHERE created_at <= ?", (now - self.ttl,))
                row = db.execute(
                    "SELECT fingerprint, pending, status, body, headers, created_at "
                    "FROM idempotency WHERE owner = ? AND key = ?",
                    (owner, key),
                ).fetchone()
                if row is not None and not (row[1] and row[5] < now - PENDING_LIMIT):
                    db.execute("COMMIT")
                    headers = orjson.loads(row[4]) if row[4] else {}
                    return Record(row[0], bool(row[1]), row[2], bytes(row[3] or b""), headers)
                db.execute(
                    "INSERT OR REPLACE INTO idempotency (owner, key, fingerprint, pending, "
                    "created_at) VALUES (?, ?, ?, 1, ?)",
                    (owner, key, fingerprint, now),
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return None

        return await self._database.run(work)

    async def complete(self, owner: str, key: str, answer: Record) -> None:
        """The answer on the record."""
        sql = (
            "UPDATE idempotency SET pending = 0, status = ?, body = ?, headers = ? "
            "WHERE owner = ? AND key = ?"
        )
        args = (answer.status, answer.body, orjson.dumps(answer.headers).decode(), owner, key)
        await self._database.run(lambda db: db.execute(sql, args))

    async def forget(self, owner: str, key: str) -> None:
        """Delete the record."""
        sql = "DELETE FROM idempotency WHERE owner = ? AND key = ?"
        await self._database.run(lambda db: db.execute(sql, (owner, key)))


CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local pending = redis.call('HGET', KEYS[1], 'pending')
  local created = tonumber(redis.call('HGET', KEYS[1], 'created_at') or '0')
  if not (pending == '1' and created < tonumber(ARGV[3])) then
    return redis.call('HGETALL', KEYS[1])
  end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'pending', '1', 'created_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {}
"""


class RedisIdempotency:
    """A hash per record, `ocrvl:idempotency:SHA256(name, key)`, expiring after the TTL; Redis
    down is a 503 (StoreUnavailable), as for jobs."""

    def __init__(self, url: str, ttl: float) -> None:
        self.where = f"redis ({redacted(url)})"
        self.ttl = ttl
        self._redis: Any = store_client(url, 2.0)
        self._claim: Any = self._redis.register_script(CLAIM)

    async def open(self) -> None:
        """Nothing to create."""

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()

    @staticmethod
    def _name(owner: str, key: str) -> str:
        digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
        return f"ocrvl:idempotency:{digest}"

    @answering
    async def claim(self, owner: str, key: str, fingerprint: str, now: float) -> Record | None:
        """One script: the record, or the claim."""
        args = [fingerprint, now, now - PENDING_LIMIT, max(int(self.ttl), 1)]
        found = await self._claim(keys=[self._name(owner, key)], args=args)
        if not found:
            return None
        values = {bytes(found[i]).decode(): bytes(found[i + 1]) for i in range(0, len(found), 2)}
        headers = orjson.loads(values["headers"]) if values.get("headers") else {}
        return Record(
            values["fingerprint"].decode(), values.get("pending") == b"1",
            int(values.get("status") or 0), values.get("body", b""), headers,
        )  # fmt: skip

    @answering
    async def complete(self, owner: str, key: str, answer: Record) -> None:
        """The answer's fields on the hash (its expiry stays the claim's)."""
        await self._redis.hset(
            self._name(owner, key),
            mapping={
                "pending": "0", "status": answer.status, "body": answer.body,
                "headers": orjson.dumps(answer.headers),
            },
        )  # fmt: skip

    @answering
    async def forget(self, owner: str, key: str) -> None:
        """Delete the hash."""
        await self._redis.delete(self._name(owner, key))
