"""Concurrency slots per key: counted in this process, or leased in Redis across replicas."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Protocol

from redis.asyncio import Redis

LEASE_PREFIX = "ocrvl:slots:"

# Drop expired leases, then take one if fewer than the limit are held. Lease scores are expiry
# times on Redis's own clock, so replicas with skewed clocks still agree.
ACQUIRE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# Push the expiry of every lease this replica holds (KEYS[i] holds lease ARGV[i + 1]).
RENEW = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for i, key in ipairs(KEYS) do
    redis.call('ZADD', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
    redis.call('PEXPIRE', key, ARGV[1])
end
return #KEYS
"""


class Slots(Protocol):
    """Where a key's requests in flight are counted."""

    async def acquire(self, name: str, limit: int) -> str | None:
        """A lease on one of `name`'s `limit` slots, or None when all are taken."""
        ...

    async def release(self, name: str, lease: str) -> None:
        """Give the slot back."""
        ...


class LocalSlots:
    """This process's own count: the default, and the fallback while Redis is down."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    async def acquire(self, name: str, limit: int) -> str | None:
        """A slot if `name` has fewer than `limit` in flight here."""
        if self._held[name] >= limit:
            return None
        self._held[name] += 1
        return "local"

    async def release(self, name: str, lease: str) -> None:
        """One fewer in flight for `name`."""
        self._held[name] -= 1
        if self._held[name] <= 0:
            del self._held[name]


class RedisSlots:
    """Leases in a Redis sorted set per key, shared by every replica on that Redis.

    A lease lives `ttl` seconds unless renewed; the owning replica renews all of its leases
    every few seconds (`renew`), so a replica that crashes frees its slots within `ttl`.
    """

    def __init__(self, client: Redis, ttl: float) -> None:
        self._ttl_ms = int(ttl * 1000)
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._client = client
        self._held: dict[str, str] = {}  # lease -> Redis key, for renewal

    async def acquire(self, name: str, limit: int) -> str | None:
        """A lease if fewer than `limit` unexpired leases of `name` exist across replicas."""
        key, lease = LEASE_PREFIX + name, uuid.uuid4().hex
        if not await self._acquire(keys=[key], args=[limit, self._ttl_ms, lease]):
            return None
        self._held[lease] = key
        return lease

    async def release(self, name: str, lease: str) -> None:
        """Delete the lease (and stop renewing it first, so a failed delete only expires it)."""
        key = self._held.pop(lease, LEASE_PREFIX + name)
        await self._client.zrem(key, lease)

    async def renew(self) -> None:
        """Extend every lease this replica holds by the lease time."""
        if self._held:
            leases = list(self._held.items())
            await self._renew(
                keys=[key for _, key in leases],
                args=[self._ttl_ms, *(lease for lease, _ in leases)],
            )
