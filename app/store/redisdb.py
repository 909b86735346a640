"""The shared store: jobs, pages and documents in Redis, for several gateway replicas.

    ocrvl:job:ID                hash: the job's columns
    ocrvl:job:ID:pages          hash: page number → the page's JSON (HSETNX: kept once)
    ocrvl:job:ID:document       the document's bytes (gone once the last page is done)
    ocrvl:jobs:owner:NAME       sorted set: the key's jobs by creation time (listing)
    ocrvl:jobs:active:NAME      set: the key's queued and running jobs (the per-key limit)
    ocrvl:jobs:runnable         sorted set: job → when it may be claimed (queued: its creation
                                time; running: its lease's end, so a dead replica's job is
                                claimed by another once the lease runs out)
    ocrvl:jobs:expiry           sorted set: job → its `expires_at` (the TTL sweep)
    ocrvl:jobs:bytes            documents' bytes kept, all keys

Every change of more than one key is one Lua script: atomic against the other replicas. Batches
(app/batches/) keep the same records under their own prefix, `ocrvl:batch:` (`BATCHES`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import fields
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from app.quotas.link import REDIS_ERRORS, describe, redacted, store_client
from app.store.base import ACTIVE, PAGE_CHUNK, Job, PageRecord, StoreUnavailable, encoded

log = logging.getLogger("ocrvl.store")
S = TypeVar("S")
R = TypeVar("R")
A = ParamSpec("A")

P = "ocrvl:"
BATCHES = P + "batch:"
COLUMNS = [column.name for column in fields(Job)]
TIMEOUT = 5.0  # seconds per call: a 100 MB document takes a while

CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 20)
for _, id in ipairs(ids) do
  local key = ARGV[4] .. 'job:' .. id
  local status = redis.call('HGET', key, 'status')
  if status == 'queued' or status == 'running' then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    redis.call('HSET', key, 'status', 'running', 'holder', ARGV[3], 'lease_until', ARGV[2])
    local started = redis.call('HGET', key, 'started_at')
    if not started or started == '' then redis.call('HSET', key, 'started_at', ARGV[1]) end
    return id
  end
  redis.call('ZREM', KEYS[1], id)
end
return false
"""
LEASE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running'
   or redis.call('HGET', KEYS[1], 'holder') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""
TRANSITION = """
local current = redis.call('HGET', KEYS[1], 'status')
local n = tonumber(ARGV[3])
local ok = false
for i = 1, n do if current == ARGV[3 + i] then ok = true end end
if not ok then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2])
for i = 4 + n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[2] ~= 'queued' and ARGV[2] ~= 'running' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[1])
end
local expires = redis.call('HGET', KEYS[1], 'expires_at')
if expires and expires ~= '' then redis.call('ZADD', KEYS[4], expires, ARGV[1]) end
return 1
"""
ADD_PAGE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'pages_done', 1)
redis.call('HINCRBY', KEYS[1], 'pages_failed', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'prompt_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'completion_tokens', ARGV[5])
return 1
"""
DROP_DOCUMENT = """
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('DECRBY', KEYS[3], redis.call('HGET', KEYS[2], 'document_bytes') or 0)
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'document_bytes', 0) end
return 1
"""


def answering(
    method: Callable[Concatenate[S, A], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, A], Coroutine[Any, Any, R]]:
    """Redis failures as StoreUnavailable (503), never a 500."""

    @functools.wraps(method)
    async def call(self: S, /, *args: A.args, **kwargs: A.kwargs) -> R:
        try:
            return await method(self, *args, **kwargs)
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(describe(exc)) from None

    return call


async def newest(redis: Any, index: str, limit: int, after: str | None) -> list[bytes]:
    """Up to `limit` members of the sorted set `index`, newest first, after the member `after`
    (none when `after` is not in it): one owner's page of a listing."""
    start = 0
    if after is not None:
        rank = await redis.zrevrank(index, after)
        if rank is None:
            return []
        start = rank + 1
    return list(await redis.zrevrange(index, start, start + limit - 1))


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class RedisStore:
    """Jobs in Redis, shared by every replica that points at it."""

    def __init__(self, url: str, prefix: str = P) -> None:
        self.where = f"redis ({redacted(url)})"
        self._p = prefix
        self._runnable, self._expiry = prefix + "jobs:runnable", prefix + "jobs:expiry"
        self._bytes = prefix + "jobs:bytes"
        self._redis: Any = store_client(url, TIMEOUT)
        self._claim: Any = self._redis.register_script(CLAIM)
        self._lease: Any = self._redis.register_script(LEASE)
        self._transition: Any = self._redis.register_script(TRANSITION)
        self._add_page: Any = self._redis.register_script(ADD_PAGE)
        self._drop_document: Any = self._redis.register_script(DROP_DOCUMENT)

    async def open(self) -> None:
        """Check that Redis answers; while it does not, job calls answer 503."""
        try:
            await self._redis.ping()
        except REDIS_ERRORS as exc:
            log.warning("the job store's Redis is unreachable (%s): jobs wait", describe(exc))

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()

    def _job(self, job_id: str) -> str:
        return f"{self._p}job:{job_id}"

    @answering
    async def create(self, job: Job, document: Path) -> None:
        """The record, the document and the indexes in one transaction."""
        data = await asyncio.to_thread(document.read_bytes)
        await asyncio.to_thread(document.unlink)
        columns = {name: _text(value) for name, value in job.columns().items()}
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._job(job.id), mapping=columns)
            pipe.set(self._job(job.id) + ":document", data)
            pipe.zadd(f"{self._p}jobs:owner:{job.owner}", {job.id: job.created_at})
            pipe.sadd(f"{self._p}jobs:active:{job.owner}", job.id)
            pipe.zadd(self._runnable, {job.id: job.created_at})
            pipe.incrby(self._bytes, len(data))
            await pipe.execute()

    @answering
    async def get(self, job_id: str) -> Job | None:
        """The job, or None."""
        values = await self._redis.hgetall(self._job(job_id))
        return _decode(values)

    @answering
    async def _many(self, ids: list[bytes]) -> list[Job | None]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self._job(job_id.decode()))
            rows = await pipe.execute()
        return [_decode(row) for row in rows]

    @answering
    async def listing(self, owner: str, limit: int, after: str | None) -> list[Job]:
        """`owner`'s jobs, newest first (removed ones leave the index here)."""
        index = f"{self._p}jobs:owner:{owner}"
        ids = await newest(self._redis, index, limit, after)
        jobs = await self._many(ids)
        gone = [job_id for job_id, job in zip(ids, jobs, strict=True) if job is None]
        if gone:
            await self._redis.zrem(index, *gone)
        return [job for job in jobs if job is not None]

    @answering
    async def active(self, owner: str) -> int:
        """`owner`'s jobs queued or running."""
        count: int = await self._redis.scard(f"{self._p}jobs:active:{owner}")
        return count

    @answering
    async def stored_bytes(self) -> int:
        """Bytes of the documents kept."""
        return int(await self._redis.get(self._bytes) or 0)

    @answering
    async def claim(self, holder: str, now: float, lease: float) -> Job | None:
        """The oldest claimable job, leased to `holder`."""
        claimed = await self._claim(keys=[self._runnable], args=[now, now + lease, holder, self._p])
        return None if not claimed else await self.get(claimed.decode())

    @answering
    async def renew(self, job_id: str, holder: str, until: float) -> bool:
        """Extend the lease while `holder` has it."""
        kept = await self._lease(
            keys=[self._job(job_id), self._runnable], args=[job_id, holder, until]
        )
        return bool(kept)

    @answering
    async def release(self, job_id: str, holder: str) -> None:
        """Give the lease up: claimable at once."""
        await self._lease(keys=[self._job(job_id), self._runnable], args=[job_id, holder, 0])

    @answering
    async def transition(
        self, job_id: str, before: tuple[str, ...], status: str, changes: dict[str, Any]
    ) -> bool:
        """Compare-and-set the status, with `changes`."""
        owner = await self._redis.hget(self._job(job_id), "owner")
        if owner is None:
            return False
        pairs = [item for name, value in changes.items() for item in (name, encoded(name, value))]
        keys = [
            self._job(job_id),
            self._runnable,
            f"{self._p}jobs:active:{owner.decode()}",
            self._expiry,
        ]
        args: list[str | int] = [job_id, status, len(before), *before]
        args += [_text(v) for v in pairs]
        return bool(await self._transition(keys=keys, args=args))

    @answering
    async def add_page(self, job_id: str, page: PageRecord) -> bool:
        """HSETNX, counted once, only while the job runs."""
        args: list[bytes | int] = [
            page.number,
            page.body,
            int(page.failed),
            page.prompt_tokens,
            page.completion_tokens,
        ]
        added = await self._add_page(
            keys=[self._job(job_id), self._job(job_id) + ":pages"], args=args
        )
        return bool(added)

    @answering
    async def pages(self, job_id: str) -> list[bytes]:
        """The pages kept, in order."""
        kept = await self._redis.hgetall(self._job(job_id) + ":pages")
        return [body for _, body in sorted(kept.items(), key=lambda item: int(item[0]))]

    async def page_chunks(self, job_id: str, size: int = PAGE_CHUNK) -> AsyncIterator[list[bytes]]:
        """The pages kept, in order: their numbers first (small), then HMGET `size` at a time."""
        key = self._job(job_id) + ":pages"
        try:
            numbers = sorted(int(number) for number in await self._redis.hkeys(key))
            for start in range(0, len(numbers), size):
                bodies = await self._redis.hmget(key, numbers[start : start + size])
                yield [body for body in bodies if body is not None]
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(describe(exc)) from None

    @answering
    async def page_numbers(self, job_id: str) -> set[int]:
        """Numbers of the pages kept."""
        numbers = await self._redis.hkeys(self._job(job_id) + ":pages")
        return {int(number) for number in numbers}

    @answering
    async def document(self, job_id: str, folder: Path) -> Path | None:
        """The document copied into `folder` (the replica's own file for its workers)."""
        data = await self._redis.get(self._job(job_id) + ":document")
        if data is None:
            return None
        path = folder / job_id
        await asyncio.to_thread(path.write_bytes, data)
        return path

    @answering
    async def drop_document(self, job_id: str) -> None:
        """Delete the document; it no longer counts in the stored bytes."""
        await self._drop_document(
            keys=[self._job(job_id) + ":document", self._job(job_id), self._bytes]
        )

    @answering
    async def drop_pages(self, job_id: str) -> None:
        """Delete the page results."""
        await self._redis.delete(self._job(job_id) + ":pages")

    @answering
    async def delete(self, job_id: str) -> None:
        """Delete everything of the job."""
        owner = await self._redis.hget(self._job(job_id), "owner")
        await self.drop_document(job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._job(job_id), self._job(job_id) + ":pages")
            pipe.zrem(self._runnable, job_id)
            pipe.zrem(self._expiry, job_id)
            if owner is not None:
                pipe.zrem(f"{self._p}jobs:owner:{owner.decode()}", job_id)
                pipe.srem(f"{self._p}jobs:active:{owner.decode()}", job_id)
            await pipe.execute()

    @answering
    async def due(self, now: float) -> list[Job]:
        """Jobs past their `expires_at`."""
        ids = await self._redis.zrangebyscore(self._expiry, "-inf", now, start=0, num=1000)
        jobs = await self._many(ids)
        gone = [job_id for job_id, job in zip(ids, jobs, strict=True) if job is None]
        if gone:
            await self._redis.zrem(self._expiry, *gone)
        return [job for job in jobs if job is not None and job.status not in ACTIVE]


def _decode(values: dict[bytes, bytes]) -> Job | None:
    if not values:
        return None
    return Job.from_columns({key.decode(): value for key, value in values.items()})
