"""Batch files in Redis, for several replicas: the same records as app/store/files.py.

ocrvl:file:ID            hash: the record's columns
ocrvl:file:ID:content    the bytes (read back with GETRANGE, a chunk at a time)
ocrvl:files:owner:NAME   sorted set: the key's files by creation time
ocrvl:files:expiry       sorted set: file → its `expires_at` (the sweep)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from app.quotas.link import redacted, store_client
from app.store.files import CHUNK, FileRecord
from app.store.redisdb import TIMEOUT, answering, newest

P = "ocrvl:"
EXPIRY = P + "files:expiry"


def _file(file_id: str) -> str:
    return f"{P}file:{file_id}"


class RedisFiles:
    """Files in Redis, shared by every replica that points at it."""

    def __init__(self, url: str) -> None:
        self.where = f"redis ({redacted(url)})"
        self._redis: Any = store_client(url, TIMEOUT)

    async def open(self) -> None:
        """Nothing to create (calls answer 503 while Redis is down)."""

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()

    @answering
    async def put(self, record: FileRecord, path: Path) -> None:
        """The record, the bytes and the indexes in one transaction."""
        data = await asyncio.to_thread(path.read_bytes)
        await asyncio.to_thread(path.unlink)
        columns = {name: str(value) for name, value in record.columns().items()}
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_file(record.id), mapping=columns)
            pipe.set(_file(record.id) + ":content", data)
            pipe.zadd(f"{P}files:owner:{record.owner}", {record.id: record.created_at})
            pipe.zadd(EXPIRY, {record.id: record.expires_at})
            await pipe.execute()

    @answering
    async def get(self, file_id: str) -> FileRecord | None:
        """The record, or None."""
        return _record(await self._redis.hgetall(_file(file_id)))

    @answering
    async def listing(self, owner: str, limit: int, after: str | None) -> list[FileRecord]:
        """`owner`'s files, newest first (removed ones leave the index here)."""
        index = f"{P}files:owner:{owner}"
        ids = await newest(self._redis, index, limit, after)
        async with self._redis.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hgetall(_file(file_id.decode()))
            rows = await pipe.execute()
        records = [_record(row) for row in rows]
        gone = [file_id for file_id, record in zip(ids, records, strict=True) if record is None]
        if gone:
            await self._redis.zrem(index, *gone)
        return [record for record in records if record is not None]

    async def content(self, file_id: str) -> AsyncIterator[bytes]:
        """The bytes, a GETRANGE at a time."""
        key, start = _file(file_id) + ":content", 0
        while chunk := await self._redis.getrange(key, start, start + CHUNK - 1):
            yield bytes(chunk)
            start += CHUNK

    @answering
    async def copy(self, file_id: str, path: Path) -> bool:
        """Write the bytes to `path`."""
        data = await self._redis.get(_file(file_id) + ":content")
        if data is None:
            return False
        await asyncio.to_thread(path.write_bytes, data)
        return True

    @answering
    async def delete(self, file_id: str) -> None:
        """Remove the record, the bytes, the index entries."""
        owner = await self._redis.hget(_file(file_id), "owner")
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(_file(file_id), _file(file_id) + ":content")
            pipe.zrem(EXPIRY, file_id)
            if owner is not None:
                pipe.zrem(f"{P}files:owner:{owner.decode()}", file_id)
            await pipe.execute()

    @answering
    async def due(self, now: float) -> list[str]:
        """Ids past their expiry."""
        ids = await self._redis.zrangebyscore(EXPIRY, "-inf", now, start=0, num=1000)
        return [raw.decode() for raw in ids]


def _record(values: dict[bytes, Any]) -> FileRecord | None:
    """A file's hash as its record; None for a hash that is gone."""
    if not values:
        return None
    return FileRecord.from_columns({k.decode(): v for k, v in values.items()})
