"""The results cache in the job store's Redis (OCRVL_REDIS_URL): every replica reads one cache.

    ocrvl:cache:KEY         the page's answer (SET with EX: Redis drops it after the TTL)
    ocrvl:cache:index       sorted set: KEY by when it was written (the oldest go first)
    ocrvl:cache:sizes       hash: KEY -> its bytes
    ocrvl:cache:bytes       the bytes of every entry in the index

A write and a sweep are each one Lua script: the total stays exact against the other replicas.
"""

from __future__ import annotations

from typing import Any

from app.quotas.link import redacted, store_client
from app.store.results import CacheSize

P = "ocrvl:cache:"
INDEX, SIZES, TOTAL = P + "index", P + "sizes", P + "bytes"
TIMEOUT = 2.0  # seconds per call
PUT = """
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then redis.call('DECRBY', KEYS[4], old) end
redis.call('SET', ARGV[4] .. ARGV[1], ARGV[2], 'EX', ARGV[5])
redis.call('HSET', KEYS[3], ARGV[1], #ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('INCRBY', KEYS[4], #ARGV[2])
return 1
"""
SWEEP = """
local function drop(member)
  local size = redis.call('HGET', KEYS[2], member)
  if size then redis.call('DECRBY', KEYS[3], size) end
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('DEL', ARGV[3] .. member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do drop(member) end
local cap = tonumber(ARGV[2])
while tonumber(redis.call('GET', KEYS[3]) or '0') > cap do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #oldest == 0 then redis.call('SET', KEYS[3], 0) break end
  drop(oldest[1])
end
return {redis.call('ZCARD', KEYS[1]), tonumber(redis.call('GET', KEYS[3]) or '0')}
"""


class RedisResults:
    """Entries as Redis strings with a TTL, an index for the cap, shared by every replica."""

    def __init__(self, url: str, ttl: float, max_bytes: int) -> None:
        self.where = f"redis ({redacted(url)})"
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._redis: Any = store_client(url, TIMEOUT)
        self._put: Any = self._redis.register_script(PUT)
        self._sweep: Any = self._redis.register_script(SWEEP)

    async def open(self) -> None:
        """Nothing to create: a Redis that does not answer yet fails the calls (misses)."""

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()

    async def get(self, key: str, now: float) -> bytes | None:
        """The entry, while Redis keeps it (its EX is the TTL)."""
        body = await self._redis.get(P + key)
        return bytes(body) if body is not None else None

    async def put(self, key: str, body: bytes, now: float) -> None:
        """The entry, its size and its place in the index, at once."""
        keys = [P + key, INDEX, SIZES, TOTAL]
        await self._put(keys=keys, args=[key, body, now, P, max(int(self.ttl), 1)])

    async def sweep(self, now: float) -> CacheSize:
        """Index entries past the TTL (Redis dropped their bodies), then the oldest over the cap."""
        entries, size = await self._sweep(
            keys=[INDEX, SIZES, TOTAL], args=[now - self.ttl, self.max_bytes, P]
        )
        return CacheSize(int(entries), int(size))
