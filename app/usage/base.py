"""What the usage totals are made of: counts, days, budgets, and the store's interface."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

FIELDS = ("requests", "pages", "prompt_tokens", "completion_tokens")
CACHED = "cached_pages"  # kept beside FIELDS: pages answered from the results cache


@dataclass(slots=True)
class Counts:
    """What one key used: answered requests, pages, and the engine's token counts; pages
    answered from the results cache apart (`cached_pages`: not in `pages`, no tokens)."""

    requests: int = 0
    pages: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_pages: int = 0

    def add(self, other: Counts) -> None:
        """Add `other`'s counts to these."""
        self.requests += other.requests
        self.pages += other.pages
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_pages += other.cached_pages

    def values(self) -> tuple[int, int, int, int]:
        """The counts in `FIELDS` order (`cached_pages` apart)."""
        return (self.requests, self.pages, self.prompt_tokens, self.completion_tokens)

    def shown(self) -> dict[str, int]:
        """The counts as the API shows them, with `total_tokens`."""
        return {
            "requests": self.requests,
            "pages": self.pages,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cached_pages": self.cached_pages,
        }


@dataclass(frozen=True, slots=True)
class DayTotals:
    """One key's counts on one UTC day."""

    key: str  # the key's name, never the key
    day: str  # YYYY-MM-DD, UTC
    counts: Counts


@dataclass(frozen=True, slots=True)
class Budget:
    """A key's page budgets; None: no budget for that period."""

    pages_per_day: int | None = None
    pages_per_month: int | None = None

    def __bool__(self) -> bool:
        return bool(self.pages_per_day or self.pages_per_month)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which budget a reservation would pass, and what the key has used of it."""

    period: str  # "day" or "month"
    limit: int
    used: int


def today(now: datetime | None = None) -> str:
    """The UTC day, YYYY-MM-DD."""
    return (now or datetime.now(UTC)).date().isoformat()


def month_days(day: str) -> list[str]:
    """Every day of `day`'s month up to and including `day` (a month's budget sums them)."""
    last = date.fromisoformat(day)
    return [last.replace(day=d).isoformat() for d in range(1, last.day + 1)]


def resets_at(period: str, day: str) -> datetime:
    """When the budget of `period` counted on `day` starts afresh: the next UTC midnight, or
    the first of the next month."""
    start = date.fromisoformat(day)
    if period == "day":
        nxt = start + timedelta(days=1)
    else:
        nxt = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime(nxt.year, nxt.month, nxt.day, tzinfo=UTC)


class UsageStore(Protocol):
    """Per key and UTC day totals. Safe from several gateways at once (SQLite: processes on
    one data dir; Redis: replicas): every change is an addition, made at once."""

    where: str  # for logs, never a password

    async def open(self) -> None:
        """Connect or create the table."""

    async def close(self) -> None:
        """Release connections."""

    async def add(self, batch: dict[tuple[str, str], Counts]) -> None:
        """Add each (key, day)'s counts to its totals, all at once."""

    async def reserve(self, key: str, day: str, pages: int, budget: Budget) -> Refusal | None:
        """Add `pages` to the key's pages on `day` unless that would pass a budget (then
        nothing is added and the refusal says which): checked and added at once."""

    async def unreserve(self, key: str, day: str, pages: int) -> None:
        """Take back `pages` reserved on `day` that were not answered."""

    async def totals(self, key: str | None, start: str, end: str) -> list[DayTotals]:
        """The totals of `key` (every key: None) from `start` to `end` (days, inclusive),
        by key then day."""
