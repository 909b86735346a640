"""`Meter`: counts what each key used, keeps the totals in the store, and holds the budgets.

    admit(context, pages)   before a request is relayed: a key with a budget reserves its pages
                            in the store at once (429 insufficient_quota when they do not fit);
                            the request's end (its context's `release`) counts what was answered
                            and gives back reserved pages that were not
    reserve(key, pages)     a job's pages when it is submitted, a batch's lines when it is
                            validated: the same reservation, kept with the job (`Reservation`)
    release(...)            the job's end (done, failed, cancelled, expired): the reserved pages
                            that got no answer are given back
    job_page(...)           a job's finished page (the job runner calls it once per page)
    cached_page(...)        a job's page answered from the results cache: counted apart, and
                            its reserved page given back (cached pages draw no budget)
    run()                   the flusher: every OCRVL_USAGE_FLUSH_INTERVAL seconds, the counts
                            gathered in memory go to the store in one batch, off the hot path

A gateway that dies loses the counts of its last flush interval (reserved pages excepted: they
are in the store before the request is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from app.auth import KeyLimits, Keyring
from app.context import RequestContext
from app.errors import BudgetExhausted
from app.metrics import Metrics
from app.settings import Settings
from app.usage.base import Budget, Counts, DayTotals, Refusal, UsageStore, resets_at, today

log = logging.getLogger("ocrvl.usage")
Reservation = dict[str, Any]  # {"day": "YYYY-MM-DD", "pages": N}: kept in the job's record
SERIES = (
    ("ocrvl_usage_requests", "Answered requests, by key name and model (job pages: pages only)."),
    (
        "ocrvl_usage_pages",
        "Pages answered (a chat request with an image is one), by key and model.",
    ),
    ("ocrvl_usage_tokens", "The engine's own token counts, by key name, model and kind."),
    (
        "ocrvl_usage_cached_pages",
        "Pages answered from the results cache (not in ocrvl_usage_pages), by key and model.",
    ),
)


class Meter:
    """Per-key usage: Prometheus counters at once, the store's totals in batches."""

    def __init__(
        self,
        store: UsageStore,
        limits_of: Callable[[str], KeyLimits],
        metrics: Metrics,
        *,
        flush_interval: float = 1.0,
    ) -> None:
        self.store = store
        self._limits_of = limits_of
        self._metrics = metrics
        self.flush_interval = flush_interval
        self._pending: dict[tuple[str, str], Counts] = {}
        self.seen: dict[tuple[str, str], Counts] = {}  # since start, by (key, model): Prometheus
        self._day = (-1, "")  # (days since the epoch, its date): one date string a day
        self._failing = False
        self._open = False
        # a read-out and a flush never interleave: a batch on its way to the store would be in
        # neither the store's totals read before it landed nor the pending counts read after
        self._store_lock = asyncio.Lock()

    def today(self) -> str:
        """The UTC day, computed once a day."""
        number = int(time.time() // 86_400)
        if number != self._day[0]:
            self._day = (number, today())
        return self._day[1]

    def budget_of(self, key: str) -> Budget:
        """The key's page budgets as the keys file sets them now."""
        limits = self._limits_of(key)
        return Budget(limits.pages_per_day, limits.pages_per_month)

    async def admit(self, context: RequestContext, pages: int) -> None:
        """Reserve `pages` under the key's budgets (429 when they would pass one), and have the
        request's end count what it used."""
        key = context.key_name or "anonymous"
        day = self.today()
        reserved = 0
        if pages:
            limits = self._limits_of(key)
            if limits.pages_per_day or limits.pages_per_month:
                budget = Budget(limits.pages_per_day, limits.pages_per_month)
                reserved = pages if await self._reserve(key, day, pages, budget) else 0

        async def end() -> None:
            await self._end(context, key, day, pages, reserved)

        context.on_release(end)

    async def reserve(self, key: str, pages: int) -> Reservation | None:
        """Reserve a job's (or a batch's) `pages` under the key's budgets at once: 429 when they
        do not fit. None when nothing was reserved (no budget, or the store did not answer:
        its pages are then counted as they finish)."""
        budget = self.budget_of(key)
        if not budget or not pages:
            return None
        day = self.today()
        if not await self._reserve(key, day, pages, budget):
            return None
        return {"day": day, "pages": pages}

    async def release(self, key: str, reservation: Reservation | None, answered: int) -> None:
        """At a job's end: give back the reserved pages beyond the `answered` ones."""
        if not reservation:
            return
        unused = int(reservation["pages"]) - answered
        if unused <= 0:
            return
        try:
            await self.store.unreserve(key, str(reservation["day"]), unused)
        except Exception as exc:  # the job has ended all the same: logged
            log.warning("usage store %s: pages not given back (%s)", self.store.where, exc)

    def job_page(
        self,
        key: str,
        model: str | None,
        usage: Mapping[str, Any] | None,
        *,
        reserved: bool = False,
    ) -> None:
        """Count one finished page of a job (failed pages are not counted: call only for pages
        that got an answer), with the engine's `usage` of it; `reserved`: the page is in the
        store already, in its job's reservation."""
        usage = usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        counts = Counts(0, 1, prompt, int(usage.get("completion_tokens") or 0))
        self._count(key, model or "unknown", self.today(), counts, 0 if reserved else 1)

    def cached_page(self, key: str, model: str | None, reservation: Reservation | None) -> None:
        """Count one job page answered from the results cache: apart from the pages read (no
        engine work, no tokens), and the page its job reserved given back with the next flush
        (docs/limits.md: cached pages draw nothing from a budget)."""
        day = str(reservation["day"]) if reservation else self.today()
        self._count(key, model or "unknown", day, Counts(cached_pages=1), -1 if reservation else 0)

    async def _reserve(self, key: str, day: str, pages: int, budget: Budget) -> bool:
        """True once reserved; a store that fails leaves the pages to the batch (served)."""
        try:
            refusal = await self.store.reserve(key, day, pages, budget)
        except Exception as exc:  # a store outage must not stop serving
            log.warning("usage store %s: budget not checked (%s)", self.store.where, exc)
            return False
        if refusal is not None:
            raise self._refused(key, day, pages, refusal)
        return True

    def _refused(self, key: str, day: str, pages: int, refusal: Refusal) -> BudgetExhausted:
        self._metrics.budget_refused.labels(key, refusal.period).inc()
        reset = resets_at(refusal.period, day)
        seconds = max((reset - datetime.now(UTC)).total_seconds(), 1.0)
        return BudgetExhausted(
            f"key {key!r} has used {refusal.used} of its {refusal.limit} pages per "
            f"{refusal.period} (budget pages-per-{refusal.period}) and this request needs "
            f"{pages}; the budget resets at {reset:%Y-%m-%dT%H:%M:%SZ} (in {seconds:.0f} s)",
            retry_after=seconds,
        )

    async def _end(
        self, context: RequestContext, key: str, day: str, asked: int, reserved: int
    ) -> None:
        """Count the answered request; give back reserved pages that were not answered."""
        pages = min(context.answered, asked)
        if reserved > pages:
            try:
                await self.store.unreserve(key, day, reserved - pages)
            except Exception as exc:  # served all the same: logged
                log.warning("usage store %s: pages not given back (%s)", self.store.where, exc)
        if not context.answered and not context.cached:
            return
        counts = Counts(1, pages, context.prompt_tokens, context.completion_tokens, context.cached)
        model = context.served_model or "unknown"
        self._count(key, model, day, counts, pages - min(reserved, pages))

    def _count(self, key: str, model: str, day: str, counts: Counts, unstored_pages: int) -> None:
        """Add to the Prometheus totals and to the next batch (`unstored_pages` of the pages:
        the others are in the store already, reserved)."""
        seen = self.seen.get((key, model))
        if seen is None:
            seen = self.seen[key, model] = Counts()
        seen.add(counts)
        counts.pages = unstored_pages
        pending = self._pending.get((key, day))
        if pending is None:
            self._pending[key, day] = counts
        else:
            pending.add(counts)

    async def totals(self, key: str | None, start: str, end: str) -> list[DayTotals]:
        """The store's totals with this gateway's counts not flushed yet added in (each count
        once, whether a flush was under way or not)."""
        async with self._store_lock:
            stored = {(t.key, t.day): t.counts for t in await self.store.totals(key, start, end)}
            for (name, day), counts in self._pending.items():
                if (key is None or name == key) and start <= day <= end:
                    stored.setdefault((name, day), Counts()).add(counts)
        return [DayTotals(name, day, counts) for (name, day), counts in sorted(stored.items())]

    async def start(self) -> None:
        """Open the store; one that does not answer yet (Redis down) is tried at each flush,
        the counts waiting in memory meanwhile: serving does not wait for it."""
        try:
            await self.store.open()
        except Exception as exc:  # a store outage must not stop serving
            log.warning("usage store %s: not reached (%s); counts wait", self.store.where, exc)
            self._failing = True
            return
        self._open = True

    async def flush(self) -> None:
        """Send the gathered counts to the store; kept for the next try if it fails."""
        async with self._store_lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, {}
            try:
                if not self._open:
                    await self.store.open()
                    self._open = True
                await self.store.add(batch)
            except Exception as exc:  # kept and tried again: not lost to an outage
                for pair, counts in batch.items():
                    self._pending.setdefault(pair, Counts()).add(counts)
                if not self._failing:
                    log.warning(
                        "usage store %s: totals not written (%s); kept", self.store.where, exc
                    )
                self._failing = True
                return
        if self._failing:
            log.info("usage store %s: totals written again", self.store.where)
        self._failing = False

    async def run(self) -> None:
        """Flush every `flush_interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()


class UsageCollector(Collector):
    """`ocrvl_usage_*{key,model}` counters, read from the meter's totals when Prometheus
    scrapes (plain additions per request instead of four locked counter increments)."""

    def __init__(self, meter: Meter) -> None:
        self._meter = meter

    def collect(self) -> Iterator[Metric]:
        """The four counter families."""
        (requests, help_r), (pages, help_p), (tokens, help_t), (cached, help_c) = SERIES
        families = (
            CounterMetricFamily(requests, help_r, labels=["key", "model"]),
            CounterMetricFamily(pages, help_p, labels=["key", "model"]),
            CounterMetricFamily(tokens, help_t, labels=["key", "model", "kind"]),
            CounterMetricFamily(cached, help_c, labels=["key", "model"]),
        )
        for (key, model), counts in list(self._meter.seen.items()):
            families[0].add_metric([key, model], counts.requests)
            families[1].add_metric([key, model], counts.pages)
            families[2].add_metric([key, model, "prompt"], counts.prompt_tokens)
            families[2].add_metric([key, model, "completion"], counts.completion_tokens)
            families[3].add_metric([key, model], counts.cached_pages)
        yield from families


def open_usage_store(settings: Settings) -> UsageStore:
    """Redis when OCRVL_REDIS_URL is set, else the data dir's SQLite file (as the job store)."""
    if settings.redis_url is not None:
        from app.usage.redisdb import RedisUsage  # noqa: PLC0415 (only replicas need it)

        return RedisUsage(settings.redis_url.get_secret_value())
    from app.usage.sqlite import SqliteUsage  # noqa: PLC0415

    return SqliteUsage(settings.data_dir)


@contextlib.asynccontextmanager
async def metering(
    settings: Settings, keyring: Keyring | None, metrics: Metrics
) -> AsyncIterator[Meter | None]:
    """The lifespan's meter (None with OCRVL_USAGE=off): store opened, flusher running; at the
    end the flusher stops, the last counts are written and the store is closed."""
    if settings.usage == "off":
        yield None
        return
    store = open_usage_store(settings)
    limits_of = keyring.limits_of if keyring is not None else (lambda _: KeyLimits())
    meter = Meter(store, limits_of, metrics, flush_interval=settings.usage_flush_interval)
    await meter.start()
    collector = UsageCollector(meter)
    metrics.registry.register(collector)
    flusher = asyncio.create_task(meter.run())
    try:
        yield meter
    finally:
        metrics.registry.unregister(collector)
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        await meter.flush()
        await store.close()
