"""The Redis connection behind the per-key limits, and whether it answers right now."""

from __future__ import annotations

import contextlib
import logging
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

log = logging.getLogger("ocrvl.quotas")

# What a Redis that is down, restarting or unreachable raises through redis-py and limits.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, OSError, TimeoutError)
NOT_REACHED = "not reached yet"


def store_client(url: str, timeout: float) -> Redis:
    """A client for what must outlive a process (jobs, batch files, usage): a call that meets a
    connection Redis closed (it restarted; the pool still holds that socket) goes once more on
    a fresh connection, so a restart costs no request. A Redis that is down is one fast refused
    connect more, not a wait (no back-off; timeouts are not retried)."""
    return Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 1),
        retry_on_error=[RedisConnectionError],
    )


def redacted(url: str) -> str:
    """`url` with its password replaced by `***`, fit for logs and /ready."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def describe(exc: BaseException) -> str:
    """A short, password-free account of a Redis failure."""
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")[:200]


class RedisLink:
    """One Redis client (one connection pool) and the up/down state the limits switch on.

    Every call has `timeout` seconds and no retry: a dead Redis costs one request at most that
    long, then the limits count in memory until `check()` finds Redis answering again.
    """

    def __init__(self, url: str, timeout: float) -> None:
        self.where = redacted(url)
        self.client: Redis = Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self.problem: str | None = NOT_REACHED

    @property
    def up(self) -> bool:
        """Redis answered its last call."""
        return self.problem is None

    def failed(self, exc: BaseException) -> None:
        """Note a failed call; the first failure after a success is logged (once)."""
        if self.problem is None:
            log.warning(
                "Redis at %s stopped answering (%s): per-key limits now count in this "
                "replica's memory until it answers again",
                self.where,
                describe(exc),
            )
        self.problem = describe(exc)

    async def check(self) -> bool:
        """PING; log the transition back when Redis answers after a failure."""
        if self.problem is not None:
            # Pooled connections from before an outage are dead even once Redis is back; using
            # one would flap the limits back to memory for a second. Only fresh ones from here.
            with contextlib.suppress(*REDIS_ERRORS):
                await self.client.connection_pool.disconnect()
        try:
            await self.client.ping()
        except REDIS_ERRORS as exc:
            if self.problem == NOT_REACHED:
                log.warning(
                    "Redis at %s is unreachable (%s): per-key limits count in this replica's "
                    "memory until it answers",
                    self.where,
                    describe(exc),
                )
            self.failed(exc)
            return False
        if self.problem is not None:
            log.info("Redis at %s answers: per-key limits are shared through it", self.where)
            self.problem = None
        return True

    def status(self) -> str:
        """`redis` while it answers, else why the limits are in memory (no password)."""
        return "redis" if self.up else f"memory (redis unreachable: {self.problem})"

    async def close(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()
