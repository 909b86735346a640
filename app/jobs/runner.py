"""The Runner: takes jobs from the store, keeps its claim on them alive, finishes them.

Each second it renews the lease of every job it runs (a job cancelled elsewhere, or taken over
after a pause longer than the lease, loses its renewal: its task is cancelled, which closes its
pages upstream so vLLM aborts them), then claims more while it runs fewer than
OCRVL_JOB_CONCURRENCY. A gateway that dies stops renewing: another one (SQLite: the next on the
same data dir, at once; Redis: any replica, once the lease runs out) claims the job and reads
only the pages not kept yet. Once a minute it sweeps out what has outlived OCRVL_JOB_TTL.

A gateway told to stop (SIGTERM, Ctrl-C: app/stopping.py) hands its jobs back as the stop
begins, not once its requests have drained: it claims no more, cancels its pages in flight
(never kept as failed) and gives up its leases, so the next gateway on the data dir (or another
replica) reads those pages again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson

from app import scratch
from app.documents.cache import PageCache
from app.documents.layouts import LayoutService
from app.documents.workers import Preprocessor
from app.jobs.events import JobEvents
from app.jobs.pages import PageWork, ocr_job, run_pages
from app.jobs.view import job_object
from app.jobs.webhook import Webhooks
from app.metrics import Metrics
from app.proxy import Relay
from app.scheduling import Scheduler
from app.settings import Settings
from app.stopping import Stop
from app.store import ENDED, Job, Store, open_store
from app.store.base import EXPIRED, FAILED, RUNNING, SUCCEEDED, StoreUnavailable
from app.store.results import ResultsCache
from app.usage.meter import Meter

log = logging.getLogger("ocrvl.jobs")
TICK = 1.0  # seconds between lease renewals and claims
SWEEP_EVERY = 60.0


class Runner:
    """Runs the store's jobs on this gateway."""

    def __init__(
        self,
        store: Store,
        *,
        relay: Relay,
        preprocessor: Preprocessor,
        settings: Settings,
        events: JobEvents,
        webhooks: Webhooks,
        meter: Meter | None = None,
        layouts: LayoutService | None = None,
        results: ResultsCache | None = None,
    ) -> None:
        self.store = store
        self.results = results  # the results cache (None: OCRVL_CACHE=off)
        self.layouts = layouts
        self.meter = meter
        self.events = events
        self.webhooks = webhooks
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._relay = relay
        self._preprocessor = preprocessor
        self._settings = settings
        self._running: dict[str, asyncio.Task[None]] = {}
        self._deliveries: set[asyncio.Task[bool]] = set()
        self._settling: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._swept = 0.0

    async def start(self, stop: Stop | None = None) -> None:
        """Start claiming (a restarted gateway resumes the jobs it finds), until `stop` begins."""
        self._loop = asyncio.create_task(self._forever())
        if stop is not None:
            self._watch = asyncio.create_task(self._hand_back_on(stop))

    async def hand_back(self) -> None:
        """Claim no more, and give the running jobs back: their pages in flight are cancelled
        (read again by whoever claims the job next), their leases given up."""
        held = list(self._running)
        tasks = [t for t in (self._loop, *self._running.values()) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job_id in held:
            with contextlib.suppress(Exception):
                await self.store.release(job_id, self.holder)
        if held:
            log.info("stopping: %d job(s) handed back, their pages in flight to be read again",
                     len(held))  # fmt: skip

    async def close(self) -> None:
        """Stop: the jobs' leases are given up, so another gateway resumes them at once."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.hand_back()
        # an ended job's clean-up runs to its end (its document dropped, its pages given back);
        # a callback it started goes the way of the others
        await asyncio.gather(*self._settling, return_exceptions=True)
        late = list(self._deliveries)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _hand_back_on(self, stop: Stop) -> None:
        """Hand the jobs back as soon as the server's stop begins."""
        await stop.wait()
        await self.hand_back()

    def cancel(self, job_id: str) -> None:
        """Stop running `job_id` here now (its in-flight pages are aborted upstream)."""
        task = self._running.get(job_id)
        if task is not None:
            task.cancel()

    async def _forever(self) -> None:
        trouble: str | None = None
        while True:
            try:
                await self.tick()
            except StoreUnavailable as exc:  # logged once per outage, not every second
                if trouble is None:
                    log.warning("jobs wait: %s", exc.message)
                trouble = exc.message
            except Exception:
                log.exception("the job runner's tick failed")
            else:
                if trouble is not None:
                    log.info("the job store answers again: jobs go on")
                trouble = None
            await asyncio.sleep(TICK)

    async def tick(self) -> None:
        """Renew, claim, sweep (once a second)."""
        now = time.time()
        lease = self._settings.job_lease
        for job_id, task in list(self._running.items()):
            if not await self.store.renew(job_id, self.holder, now + lease):
                task.cancel()
        while len(self._running) < self._settings.job_concurrency:
            job = await self.store.claim(self.holder, now, lease)
            if job is None:
                break
            task = asyncio.create_task(self._run(job))
            self._running[job.id] = task
            task.add_done_callback(self._forget(job.id))
        if now - self._swept >= SWEEP_EVERY:
            self._swept = now
            await self.sweep(now)

    def _forget(self, job_id: str) -> Callable[[asyncio.Task[None]], None]:
        def forget(_: asyncio.Task[None]) -> None:
            self._running.pop(job_id, None)

        return forget

    async def _run(self, job: Job) -> None:
        event = "resumed" if job.pages_done else "started"
        self.events.event(job, event, RUNNING, holder=self.holder, pages_done=job.pages_done)
        self.events.running.inc()
        folder = Path(await asyncio.to_thread(scratch.folder, "job"))
        try:
            path = await self.store.document(job.id, folder)
            if path is None:
                await self._end(job, FAILED, _error("the job's document is gone from the store"))
                return
            ocr = ocr_job(job, str(path))
            work = PageWork(
                job, ocr, self.store, self._relay, self._preprocessor, self.events, self.meter,
                self.layouts, asyncio.Semaphore(self._settings.ocr_block_concurrency),
                self._cache(job),
            )  # fmt: skip
            await run_pages(work, self._settings.job_page_concurrency)
            await self._conclude(job)
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:  # the job stays claimed; another tick, or gateway, resumes
            log.warning("job %s paused: %s", job.id, exc.message)
        except Exception as exc:
            log.exception("job %s failed", job.id)
            kept = await self.store.get(job.id) or job  # its pages kept before it stopped
            await self._end(kept, FAILED, _error(f"the job stopped: {type(exc).__name__}: {exc}"))
        finally:
            self.events.running.dec()
            await asyncio.to_thread(shutil.rmtree, folder, True)

    def _cache(self, job: Job) -> PageCache | None:
        """The results cache for the job's pages, unless it is off or the job bypassed it
        (its options, the served model's revision included, taken when it was submitted)."""
        options = job.spec.get("cache")
        if self.results is None or not isinstance(options, dict):
            return None
        return PageCache.scoped(self.results, job.owner, options, self.events.metrics)

    async def _conclude(self, job: Job) -> None:
        """Every page is kept: succeeded, or failed when every page failed."""
        kept = await self.store.get(job.id)
        if kept is None:
            return
        if kept.pages_total and kept.pages_failed == kept.pages_total:
            first = orjson.loads((await self.store.pages(job.id))[0]).get("error")
            await self._end(kept, FAILED, first or _error("every page failed"))
            return
        await self._end(kept, SUCCEEDED, None)

    async def _end(self, job: Job, status: str, error: dict[str, Any] | None) -> None:
        """Move `job` (read after its last page settled, so its counts are final) to `status`.
        The count and the `ended` line go out with no await after the move: a client that
        sees the job ended finds it in /metrics and in the log already."""
        now = time.time()
        expires = now + self._settings.job_ttl
        changes = {"finished_at": now, "expires_at": expires, "error": error}
        if not await self.store.transition(job.id, (RUNNING,), status, changes):
            return  # cancelled meanwhile, or another gateway finished it
        ended = dataclasses.replace(  # the record as the store keeps it now
            job, status=status, finished_at=now, expires_at=expires, error=error
        )
        self.events.event(ended, "ended", status, pages_failed=ended.pages_failed)
        await self._settled(self._clean_up(ended))

    async def _settled(self, clean_up: Coroutine[Any, Any, None]) -> None:
        """Run an ended job's `clean_up` to its end: cancelled meanwhile (a stop, a lost
        lease), the job's task stops waiting for it, but it goes on and `close` waits for it."""
        task = asyncio.create_task(clean_up)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        await asyncio.shield(task)

    async def _clean_up(self, ended: Job) -> None:
        """An ended job's clean-up: its document dropped (a store that stops answering leaves
        it to the TTL sweep), its unanswered pages given back, its callback started."""
        try:
            await self.store.drop_document(ended.id)
        except StoreUnavailable as exc:
            log.warning("job %s ended; its document stays until it expires: %s", ended.id,
                        exc.message)  # fmt: skip
        await self.release(ended)
        url = ended.spec.get("callback_url")
        if url:
            delivery = asyncio.create_task(self.webhooks.deliver(url, ended.id, job_object(ended)))
            self._deliveries.add(delivery)
            delivery.add_done_callback(self._deliveries.discard)

    async def release(self, job: Job) -> None:
        """Give back the job's reserved pages that got no answer (call once, by whoever moved it
        to its end: no page is kept after that, so its counts are final)."""
        if self.meter is not None:
            answered = job.pages_done - job.pages_failed
            await self.meter.release(job.owner, reservation_of(job), answered)

    async def sweep(self, now: float) -> None:
        """Ended jobs past their TTL lose their results and show `expired`; expired ones go."""
        for job in await self.store.due(now):
            if job.status == EXPIRED:
                await self.store.delete(job.id)
                continue
            if job.status not in ENDED:
                continue
            changes = {"expires_at": now + self._settings.job_ttl}
            if await self.store.transition(job.id, ENDED, EXPIRED, changes):
                await self.store.drop_pages(job.id)
                await self.store.drop_document(job.id)
                self.events.event(job, "expired", EXPIRED)


async def open_jobs(
    settings: Settings,
    *,
    metrics: Metrics,
    scheduler: Scheduler,
    relay: Relay,
    documents: Preprocessor,
    stack: AsyncExitStack,
    meter: Meter | None = None,
    layouts: LayoutService | None = None,
    results: ResultsCache | None = None,
    stop: Stop | None = None,
) -> Runner:
    """The job store (SQLite or Redis) opened and the runner started, both closed by `stack`;
    the runner hands its jobs back as soon as `stop` begins."""
    store = open_store(settings)
    await store.open()
    stack.push_async_callback(store.close)
    webhooks = Webhooks(settings)
    stack.push_async_callback(webhooks.aclose)
    events = JobEvents(metrics, scheduler.queue.background_waiting)
    stack.callback(events.close)
    runner = Runner(
        store, relay=relay, preprocessor=documents, settings=settings, events=events,
        webhooks=webhooks, meter=meter, layouts=layouts, results=results,
    )  # fmt: skip
    await runner.start(stop)
    stack.push_async_callback(runner.close)
    log.info("jobs are kept in %s; this gateway runs them as %s", store.where, runner.holder)
    return runner


def reservation_of(job: Job) -> dict[str, Any] | None:
    """The pages reserved for the job under its key's budgets: a job's at its submission (in
    its spec), a batch's at its validation (in `extra`); None when none were."""
    reserved = job.spec.get("reserved") or job.extra.get("reserved")
    return reserved if isinstance(reserved, dict) else None


def _error(message: str) -> dict[str, Any]:
    return {"message": message, "type": "server_error", "param": None, "code": "job_failed"}
