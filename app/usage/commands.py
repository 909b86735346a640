"""`ocrvl keys usage`: every key's totals per day, read from the gateway's store; budget flags."""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

from app.usage.base import Counts, DayTotals, UsageStore, today

BUDGET_FLAGS = ("pages_per_day", "pages_per_month")


def add_budget_flags(
    parser: argparse.ArgumentParser, kind: Callable[[str], object], *, editing: bool
) -> None:
    """`--pages-per-day` and `--pages-per-month` on `keys create` / `keys set`."""
    more = ", 0 or default: none" if editing else " (default: none)"
    parser.add_argument("--pages-per-day", type=kind, help=f"page budget per UTC day{more}")
    parser.add_argument("--pages-per-month", type=kind, help=f"page budget per UTC month{more}")


def register(keys_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ocrvl keys usage [NAME] [--since DAY] [--until DAY] [--csv]`."""
    usage = keys_commands.add_parser(
        "usage", help="requests, pages and tokens per key and UTC day (from the gateway's store)"
    )
    usage.add_argument("name", nargs="?", help="only this key (default: every key)")
    usage.add_argument("--since", type=_date, help="first day, YYYY-MM-DD (default: the 1st)")
    usage.add_argument("--until", type=_date, help="last day, YYYY-MM-DD (default: today, UTC)")
    usage.add_argument("--csv", action="store_true", help="CSV rows instead of a table")
    usage.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("OCRVL_DATA_DIR", "data")),
        help="the gateway's data dir (default OCRVL_DATA_DIR or ./data)",
    )
    usage.set_defaults(func=keys_usage)


def _date(value: str) -> str:
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date as YYYY-MM-DD; got {value!r}") from None


def _store(data_dir: Path) -> UsageStore | str:
    """The store the gateway writes (OCRVL_REDIS_URL, else the data dir), or why there is none."""
    url = os.environ.get("OCRVL_REDIS_URL")
    if url:
        from app.usage.redisdb import RedisUsage  # noqa: PLC0415

        return RedisUsage(url)
    from app.usage.sqlite import FILE_NAME, SqliteUsage  # noqa: PLC0415

    if not (data_dir / FILE_NAME).exists():
        return f"no usage store at {data_dir / FILE_NAME}: give --data-dir (or OCRVL_DATA_DIR)"
    return SqliteUsage(data_dir)


async def _read(store: UsageStore, name: str | None, since: str, until: str) -> list[DayTotals]:
    await store.open()
    try:
        return await store.totals(name, since, until)
    finally:
        await store.close()


def keys_usage(args: argparse.Namespace) -> int:
    """Print the totals (a running gateway's last second or so of counts may not be in yet)."""
    until = args.until or today()
    since = args.since or until[:8] + "01"
    store = _store(args.data_dir)
    if isinstance(store, str):
        print(f"ocrvl keys usage: {store}", file=sys.stderr)
        return 2
    try:
        rows = asyncio.run(_read(store, args.name, since, until))
    except Exception as exc:  # the store is down or not one: say so, no traceback
        print(f"ocrvl keys usage: cannot read {store.where}: {exc}", file=sys.stderr)
        return 2
    if args.csv:
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(["key", "date", *Counts().shown()])
        for row in rows:
            out.writerow([row.key, row.day, *row.counts.shown().values()])
        return 0
    print(
        f"{'KEY':<24} {'DATE':<10} {'REQUESTS':>9} {'PAGES':>9} {'PROMPT':>12} {'COMPLETION':>12}"
        f" {'CACHED':>9}"
    )
    for key in sorted({row.key for row in rows}):
        total = Counts()
        for row in (r for r in rows if r.key == key):
            total.add(row.counts)
            print(_line(key, row.day, row.counts))
        print(_line(key, "total", total))
    return 0


def _line(key: str, day: str, counts: Counts) -> str:
    requests, pages, prompt, completion = counts.values()
    line = f"{key:<24} {day:<10} {requests:>9} {pages:>9} {prompt:>12} {completion:>12}"
    return f"{line} {counts.cached_pages:>9}"
