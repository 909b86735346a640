"""Usage totals in Redis (OCRVL_REDIS_URL), beside the jobs: every replica adds into one total.

    ocrvl:usage:NAME:DAY    hash: requests, pages, prompt_tokens, completion_tokens,
                            cached_pages (HINCRBY)
    ocrvl:usage:days        sorted set: "DAY NAME" by the day's ordinal (the read-out's index)

A budget's check and its addition are one Lua script: two replicas cannot both take the last page.
"""

from __future__ import annotations

from datetime import date

from redis.asyncio import Redis

from app.quotas.link import redacted, store_client
from app.usage.base import CACHED, FIELDS, Budget, Counts, DayTotals, Refusal, month_days

P = "ocrvl:usage:"
INDEX = P + "days"
TIMEOUT = 2.0  # seconds per call
RESERVE = """
local n, per_day, per_month = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local today = KEYS[#KEYS - 1]
if per_day > 0 then
  local used = tonumber(redis.call('HGET', today, 'pages') or '0')
  if used + n > per_day then return {1, used} end
end
if per_month > 0 then
  local used = 0
  for i = 1, #KEYS - 1 do used = used + tonumber(redis.call('HGET', KEYS[i], 'pages') or '0') end
  if used + n > per_month then return {2, used} end
end
redis.call('HINCRBY', today, 'pages', n)
redis.call('ZADD', KEYS[#KEYS], 'NX', ARGV[5], ARGV[4])
return {0, 0}
"""


def _hash(key: str, day: str) -> str:
    return f"{P}{key}:{day}"


class RedisUsage:
    """Per key and day totals in Redis hashes, shared by every replica."""

    def __init__(self, url: str) -> None:
        self.where = f"redis ({redacted(url)})"
        self._redis: Redis = store_client(url, TIMEOUT)
        self._reserve = self._redis.register_script(RESERVE)

    async def open(self) -> None:
        """Check that Redis answers."""
        await self._redis.ping()

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()

    async def add(self, batch: dict[tuple[str, str], Counts]) -> None:
        """HINCRBY every count of the batch in one transaction."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for (key, day), counts in batch.items():
                for name, value in zip(FIELDS, counts.values(), strict=True):
                    if value:
                        pipe.hincrby(_hash(key, day), name, value)
                if counts.cached_pages:
                    pipe.hincrby(_hash(key, day), CACHED, counts.cached_pages)
                pipe.zadd(INDEX, {f"{day} {key}": date.fromisoformat(day).toordinal()}, nx=True)
            await pipe.execute()

    async def reserve(self, key: str, day: str, pages: int, budget: Budget) -> Refusal | None:
        """The budget check and the addition, atomic against the other replicas."""
        keys = [_hash(key, d) for d in month_days(day)] + [INDEX]
        args: list[int | str] = [pages, budget.pages_per_day or 0, budget.pages_per_month or 0]
        args += [f"{day} {key}", date.fromisoformat(day).toordinal()]
        verdict, used = await self._reserve(keys=keys, args=args)
        if verdict == 0:
            return None
        if verdict == 1:
            return Refusal("day", budget.pages_per_day or 0, int(used))
        return Refusal("month", budget.pages_per_month or 0, int(used))

    async def unreserve(self, key: str, day: str, pages: int) -> None:
        """Subtract the pages."""
        await self._redis.hincrby(_hash(key, day), "pages", -pages)

    async def totals(self, key: str | None, start: str, end: str) -> list[DayTotals]:
        """The hashes of the days asked, by key then day."""
        low, high = date.fromisoformat(start).toordinal(), date.fromisoformat(end).toordinal()
        members = await self._redis.zrangebyscore(INDEX, low, high)
        wanted = []
        for member in members:
            day, _, name = bytes(member).decode().partition(" ")  # type: ignore[arg-type]
            if key is None or name == key:
                wanted.append((name, day))
        async with self._redis.pipeline(transaction=False) as pipe:
            for name, day in wanted:
                pipe.hgetall(_hash(name, day))
            rows = await pipe.execute()
        found = []
        for (name, day), row in zip(wanted, rows, strict=True):
            values = {field.decode(): int(value) for field, value in row.items()}
            counts = Counts(**{f: values.get(f, 0) for f in (*FIELDS, CACHED)})
            found.append(DayTotals(name, day, counts))
        return sorted(found, key=lambda totals: (totals.key, totals.day))
