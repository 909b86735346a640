"""`Quotas`: admits a key's request under its requests per minute and concurrent requests."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

from app.auth import KeyLimits, Keyring
from app.errors import RateLimited
from app.metrics import Metrics
from app.quotas.link import REDIS_ERRORS, RedisLink
from app.quotas.slots import LocalSlots, RedisSlots, Slots
from app.settings import Settings

CHECK_EVERY = 1.0  # seconds between Redis pings (how soon /ready and the fallback follow it)
LEASE_SECONDS = 30.0  # a crashed replica's concurrency slots are free again after this
HOLD_SMOOTHING = 0.2  # weight of the newest request in a key's average slot hold time


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits in force; 0 is unlimited."""

    rpm: int
    concurrency: int


class PerMinute(RateLimitItemPerMinute):
    """One key's RPM; its storage key leaves the amount out, so an edited limit keeps the
    requests already counted in the window instead of starting a fresh one."""

    def key_for(self, *identifiers: bytes | str | int | float) -> str:
        """`ocrvl-rpm/NAME`."""
        return "/".join([self.namespace, *(str(i) for i in identifiers)])


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's x-ratelimit-reset-* headers write it: `20ms`, `1s`, `6m0s`."""
    millis = max(round(seconds * 1000), 0)
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


@dataclass(slots=True)
class Grant:
    """What one admitted request holds until its response is fully sent."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    release: Callable[[], Awaitable[None]] | None = None  # gives back the concurrency slot


class Quotas:
    """Per-key limits over memory storage, or Redis storage while OCRVL_REDIS_URL answers."""

    def __init__(
        self,
        defaults: Limits,
        limits_of: Callable[[str], KeyLimits],
        metrics: Metrics,
        *,
        redis_url: str | None = None,
        redis_timeout: float = 0.5,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self._defaults = defaults
        self._limits_of = limits_of
        self._metrics = metrics
        self._memory = (MovingWindowRateLimiter(MemoryStorage()), LocalSlots())
        self._link: RedisLink | None = None
        self._renew_every = lease_seconds / 3  # a lease survives two missed renewals
        self._shared: tuple[MovingWindowRateLimiter, RedisSlots] | None = None
        if redis_url is not None:
            self._link = RedisLink(redis_url, redis_timeout)
            storage = RedisStorage(
                "async+redis://",
                implementation="redispy",
                key_prefix="ocrvl",
                connection_pool=self._link.client.connection_pool,  # type: ignore[arg-type]
            )
            self._shared = (
                MovingWindowRateLimiter(storage),
                RedisSlots(self._link.client, lease_seconds),
            )
        self._hold_seconds: dict[str, float] = {}
        self._items: dict[int, PerMinute] = {}
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, keyring: Keyring | None, metrics: Metrics) -> Quotas:
        """The limits OCRVL_KEY_RPM, OCRVL_KEY_CONCURRENCY and OCRVL_REDIS_URL describe."""
        url = settings.redis_url.get_secret_value() if settings.redis_url is not None else None
        return cls(
            Limits(settings.key_rpm, settings.key_concurrency),
            keyring.limits_of if keyring is not None else lambda _: KeyLimits(),
            metrics,
            redis_url=url,
        )

    async def start(self) -> None:
        """Reach Redis if one is set (counting in memory if not), and keep watching it."""
        if self._link is not None and self._shared is not None:
            await self._link.check()
            self._watcher = asyncio.create_task(self._watch(self._link, self._shared[1]))

    async def close(self) -> None:
        """Stop watching Redis and close its connections."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._link is not None:
            await self._link.close()

    def storage(self) -> str:
        """Where the limits count now: `memory`, `redis`, or `memory (redis unreachable: …)`."""
        return "memory" if self._link is None else self._link.status()

    def limits(self, name: str) -> Limits:
        """Key `name`'s limits: its keys-file entry's, else the settings' defaults."""
        own = self._limits_of(name)
        return Limits(
            self._defaults.rpm if own.rpm is None else own.rpm,
            self._defaults.concurrency if own.concurrency is None else own.concurrency,
        )

    async def admit(self, name: str, pages: int = 1) -> Grant | None:
        """Count a request of key `name` as `pages` (its `n`): RateLimited (429) if over a
        limit, else what it holds. None when the key is unlimited (nothing to release)."""
        limits = self.limits(name)
        if not (limits.rpm or limits.concurrency):
            return None
        if limits.concurrency and pages > limits.concurrency:
            raise self._never(name, limits.concurrency, pages)
        if self._link is not None and self._shared is not None and self._link.up:
            try:
                return await self._admit(name, limits, pages, *self._shared)
            except REDIS_ERRORS as exc:
                self._link.failed(exc)
        return await self._admit(name, limits, pages, *self._memory)

    async def widen(self, name: str, pages: int) -> Grant | None:
        """A request admitted as one page is `pages` (`n` > 1, known once its body is read):
        count the other `pages - 1` too, or 429 as `admit` would for all `pages` at once."""
        limits = self.limits(name)
        if limits.concurrency and pages > limits.concurrency:
            raise self._never(name, limits.concurrency, pages)
        return await self.admit(name, pages - 1) if pages > 1 else None

    async def _admit(
        self,
        name: str,
        limits: Limits,
        pages: int,
        window: MovingWindowRateLimiter,
        slots: Slots,
    ) -> Grant:
        grant = Grant()
        if limits.concurrency:
            leases = await _take(slots, name, limits.concurrency, pages)
            if leases is None:
                raise self._busy(name, limits.concurrency)
            grant.release = self._releaser(name, slots, leases)
        try:
            if limits.rpm:
                grant.headers = await self._count(name, limits.rpm, window, pages)
        except BaseException:
            if grant.release is not None:
                await grant.release()
            raise
        return grant

    async def _count(
        self, name: str, rpm: int, window: MovingWindowRateLimiter, pages: int = 1
    ) -> list[tuple[bytes, bytes]]:
        """A request of `pages` in `name`'s moving minute; a refused one is not counted."""
        item = self._items.get(rpm)
        if item is None:
            item = self._items[rpm] = PerMinute(rpm, namespace="ocrvl-rpm")
        accepted = await window.hit(item, name, cost=pages)
        stats = await window.get_window_stats(item, name)
        reset = max(stats.reset_time - time.time(), 0.0)  # the oldest counted request leaves
        headers = [
            (b"x-ratelimit-limit-requests", str(rpm).encode()),
            (b"x-ratelimit-remaining-requests", str(max(stats.remaining, 0)).encode()),
            (b"x-ratelimit-reset-requests", go_duration(reset).encode()),
        ]
        if not accepted:
            self._metrics.rate_limited.labels(name, "rpm").inc()
            raise RateLimited(
                f"Rate limit reached for key {name!r} on requests per minute (RPM): Limit {rpm}, "
                f"Used {rpm - max(stats.remaining, 0)}, Requested {pages}. Please try again in "
                f"{go_duration(reset)}, or spread requests evenly over the minute.",
                retry_after=reset,
                headers={k.decode(): v.decode() for k, v in headers},
            )
        return headers

    def _busy(self, name: str, limit: int) -> RateLimited:
        """429 for a key at its concurrency: retry when one of its slots should be free again.

        Slots free at about `limit / average hold time` per second, so the next one in about
        average hold / limit (1 s when nothing is known yet, at most a minute).
        """
        self._metrics.rate_limited.labels(name, "concurrency").inc()
        wait = min(max(self._hold_seconds.get(name, 1.0) / limit, 1.0), 60.0)
        return RateLimited(
            f"Too many concurrent requests for key {name!r}: Limit {limit} in flight. Please "
            f"try again in {math.ceil(wait)}s, or send fewer requests at once (PaddleOCR: "
            "lower vl_rec_max_concurrency to this limit).",
            retry_after=wait,
            headers={},
        )

    def _never(self, name: str, limit: int, pages: int) -> RateLimited:
        """429 that no retry can cure: `n` asks for more pages than the key may run at once."""
        self._metrics.rate_limited.labels(name, "concurrency").inc()
        return RateLimited(
            f"Too many concurrent requests for key {name!r}: this request's n={pages} counts as "
            f"{pages} pages, over the key's limit of {limit} in flight, so it can never be "
            "admitted; lower `n`.",
            retry_after=60.0,
            headers={"x-should-retry": "false"},  # the OpenAI SDK would retry it in vain
        )

    def _releaser(
        self, name: str, slots: Slots, leases: list[str]
    ) -> Callable[[], Awaitable[None]]:
        started = time.monotonic()
        released = False

        async def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            held = time.monotonic() - started
            average = self._hold_seconds.get(name, held)
            self._hold_seconds[name] = average + HOLD_SMOOTHING * (held - average)
            try:
                for lease in leases:
                    await slots.release(name, lease)
            except REDIS_ERRORS as exc:  # the lease is no longer renewed: it expires by itself
                if self._link is not None:
                    self._link.failed(exc)

        return release

    async def _watch(self, link: RedisLink, slots: RedisSlots) -> None:
        """Ping Redis every second; renew this replica's leases while it answers."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(CHECK_EVERY)
            if await link.check() and time.monotonic() - renewed >= self._renew_every:
                try:
                    await slots.renew()
                    renewed = time.monotonic()
                except REDIS_ERRORS as exc:
                    link.failed(exc)


async def _take(slots: Slots, name: str, limit: int, pages: int) -> list[str] | None:
    """One of `name`'s slots per page, all or none (those taken are given back on failure)."""
    leases: list[str] = []
    try:
        for _ in range(pages):
            lease = await slots.acquire(name, limit)
            if lease is None:
                break
            leases.append(lease)
        else:
            return leases
    except BaseException:
        for lease in leases:
            await slots.release(name, lease)
        raise
    for lease in leases:
        await slots.release(name, lease)
    return None
