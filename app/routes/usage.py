"""`GET /v1/usage`: the calling key's own requests, pages and tokens per UTC day, and budgets."""

from __future__ import annotations

from datetime import date
from typing import Any

from fastapi import APIRouter

from app.auth import KeyName
from app.errors import InvalidRequest, NotFound, quoted
from app.state import GatewayDep
from app.usage.base import Counts, resets_at
from app.usage.meter import Meter

router = APIRouter()
MAX_DAYS = 400  # a year and some: one answer stays small


def _day(value: str | None, name: str, default: str) -> date:
    """A `YYYY-MM-DD` query parameter, or 400 naming it."""
    try:
        return date.fromisoformat(value if value is not None else default)
    except ValueError:
        raise InvalidRequest(
            f"`{name}` must be a date as YYYY-MM-DD (UTC); got {quoted(value)}", param=name
        ) from None


@router.get("/v1/usage")
async def usage(
    key: KeyName, gateway: GatewayDep, start: str | None = None, end: str | None = None
) -> dict[str, Any]:
    """Totals per day from `start` to `end` (default: this month so far), the key's budgets."""
    meter = gateway.usage
    if meter is None:
        raise NotFound("usage is not counted on this gateway (OCRVL_USAGE=off)")
    today = meter.today()
    first, last = _day(start, "start", today[:8] + "01"), _day(end, "end", today)
    if first > last:
        raise InvalidRequest(f"`start` ({first}) is after `end` ({last})", param="start")
    if (last - first).days >= MAX_DAYS:
        raise InvalidRequest(
            f"ask for at most {MAX_DAYS} days at a time; got {(last - first).days + 1}",
            param="end",
        )
    days = await meter.totals(key, first.isoformat(), last.isoformat())
    total = Counts()
    for day in days:
        total.add(day.counts)
    return {
        "object": "usage",
        "key": key,
        "start": first.isoformat(),
        "end": last.isoformat(),
        "data": [{"date": day.day, **day.counts.shown()} for day in days],
        "total": total.shown(),
        "budgets": await _budgets(meter, key, today),
    }


async def _budgets(meter: Meter, key: str, today: str) -> list[dict[str, Any]]:
    """Each page budget of the key: its limit, what is used of it, when it resets."""
    budget = meter.budget_of(key)
    if not budget:
        return []
    month = await meter.totals(key, today[:8] + "01", today)
    used = {
        "day": sum(t.counts.pages for t in month if t.day == today),
        "month": sum(t.counts.pages for t in month),
    }
    shown = []
    for period, limit in (("day", budget.pages_per_day), ("month", budget.pages_per_month)):
        if limit:
            shown.append(
                {
                    "budget": f"pages-per-{period}",
                    "limit": limit,
                    "used": used[period],
                    "resets_at": f"{resets_at(period, today):%Y-%m-%dT%H:%M:%SZ}",
                }
            )
    return shown
