"""The BatchRunner: the jobs' Runner (claims, leases, takeover after a crash) running batches.

A claimed batch is validated first (the whole file: app/batches/lines.py), then its lines run,
at most OCRVL_JOB_PAGE_CONCURRENCY at once in the background lane, each answer kept in the store
as it finishes (a gateway that takes the batch over runs only the lines not kept yet). At the
end its output and error files are written (app/batches/results.py). A cancelled batch stops its
lines in flight (vLLM aborts them), then keeps what finished, in its files, as `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from app import scratch
from app.batches.lines import Line, parsed, read_lines, validation_errors
from app.batches.requests import Chats, answer
from app.batches.results import write_files
from app.documents.workers import Preprocessor
from app.errors import BudgetExhausted
from app.jobs.runner import Runner
from app.scheduling.queue import BACKGROUND
from app.settings import Settings
from app.store import ACTIVE, Files, Job, Store, open_files, open_store
from app.store.base import (
    CANCELLED,
    EXPIRED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    PageRecord,
    StoreUnavailable,
)
from app.usage.meter import Meter

log = logging.getLogger("ocrvl.batches")


class BatchRunner(Runner):
    """Runs the store's batches on this gateway."""

    def __init__(
        self, store: Store, files: Files, chats: Chats, *, jobs: Runner,
        documents: Preprocessor, meter: Meter | None,
    ) -> None:  # fmt: skip
        super().__init__(
            store, relay=chats.relay, preprocessor=documents, settings=chats.settings,
            events=jobs.events, webhooks=jobs.webhooks, meter=meter,
        )  # fmt: skip
        self.files = files
        self.chats = chats
        self._closing = False
        self._finishing: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """Stop (the batches' leases are given up) once cancelled ones have their files."""
        self._closing = True
        await super().close()
        await asyncio.gather(*self._finishing, return_exceptions=True)

    async def _run(self, job: Job) -> None:
        folder = Path(await asyncio.to_thread(scratch.folder, "batch"))
        log.info("batch %s runs here (%d lines kept before)", job.id, job.pages_done)
        try:
            path = await self.store.document(job.id, folder)
            if path is None:
                await self._fail(job, [_error("input_missing", "the input file is gone")])
                return
            if "in_progress_at" not in job.extra:
                validated = await self._validate(job, path)
                if validated is None:
                    return
                job = validated
            expired = await self._lines(job, path)
            await self._finish(job.id, path if expired else None)
        except asyncio.CancelledError:
            if not self._closing:  # cancelled (or taken over): the files, if it was cancelled
                self._after_cancel(job.id)
            raise
        except StoreUnavailable as exc:  # still claimed: another tick, or gateway, resumes it
            log.warning("batch %s paused: %s", job.id, exc.message)
        except Exception as exc:
            log.exception("batch %s failed", job.id)
            await self._fail(job, [_error("batch_failed", f"{type(exc).__name__}: {exc}")])
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def _validate(self, job: Job, path: Path) -> Job | None:
        """The batch in progress with its line count, or None once it failed validation."""
        settings = self._settings
        count, errors = await asyncio.to_thread(
            validation_errors, path, job.spec["endpoint"], settings.batch_max_requests,
            settings.max_body_bytes,
        )  # fmt: skip
        reservation = None
        if not errors and self.meter is not None:  # every line, under the key's page budgets
            try:
                reservation = await self.meter.reserve(job.owner, count)
            except BudgetExhausted as exc:
                errors = [_error("budget_exhausted", exc.message)]
        if errors:
            await self._fail(job, errors)
            return None
        extra = {**job.extra, "in_progress_at": time.time(), "reserved": reservation}
        changes = {"pages_total": count, "extra": extra}
        if not await self.store.transition(job.id, (RUNNING,), RUNNING, changes):
            if self.meter is not None:  # cancelled meanwhile: nothing of it will run
                await self.meter.release(job.owner, reservation, 0)
            return None
        job.pages_total, job.extra = count, extra
        return job

    async def _lines(self, job: Job, path: Path) -> bool:
        """Run every line not kept yet; True when the completion window ended first."""
        BACKGROUND.set(True)  # this task's (and its lines') requests take the background lane
        kept = await self.store.page_numbers(job.id)
        slots = asyncio.Semaphore(self._settings.job_page_concurrency)
        lines = read_lines(path, self._settings.max_body_bytes)
        expired = False

        async def one(line: Line) -> None:
            try:
                await self._line(job, line)
            finally:
                slots.release()

        try:
            async with asyncio.TaskGroup() as group:
                while (item := await asyncio.to_thread(next, lines, None)) is not None:
                    if item[0] in kept:
                        continue
                    await slots.acquire()
                    if time.time() >= job.spec["window_ends"]:
                        slots.release()
                        expired = True
                        break
                    group.create_task(one(parsed(*item, job.spec["endpoint"])))
        finally:
            lines.close()
        return expired

    async def _line(self, job: Job, line: Line) -> None:
        """One line answered and kept (counted in the key's usage once, when it was answered);
        the loop guard watches it when the batch asked (`loop_guard`), else as
        OCRVL_CHAT_LOOP_GUARD has a live chat request watched."""
        guard = job.spec.get("loop_guard") or self._settings.chat_loop_guard
        done = await answer(self.chats, job.id, job.owner, line, guarded=guard == "on")
        self.events.metrics.count_stops("batches", list(done.stops))
        usage = done.usage
        record = PageRecord(
            line.number, done.line, done.failed, int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
        )  # fmt: skip
        kept = await self.store.add_page(job.id, record)
        if kept and not done.failed and self.meter is not None:
            reserved = bool(job.extra.get("reserved"))  # in the store since its validation
            self.meter.job_page(job.owner, done.model, usage, reserved=reserved)

    async def _finish(self, batch_id: str, expired: Path | None) -> None:
        """finalizing, the files written, then completed (or expired: `expired` is the input)."""
        job = await self.store.get(batch_id)
        if job is None:
            return
        extra = {**job.extra, "finalizing_at": time.time()}
        if not await self.store.transition(batch_id, (RUNNING,), RUNNING, {"extra": extra}):
            return
        unrun = None if expired is None else (expired, await self.store.page_numbers(batch_id))
        ttl = self._settings.job_ttl
        chunks = self.store.page_chunks(batch_id)
        output, errors = await write_files(
            self.files, batch_id, job.owner, chunks, ttl=ttl, unrun=unrun
        )
        now = time.time()
        stamp, status = ("completed_at", SUCCEEDED) if expired is None else ("expired_at", EXPIRED)
        extra = {**extra, stamp: now, "output_file_id": output, "error_file_id": errors}
        changes = {"extra": extra, "finished_at": now, "expires_at": now + ttl}
        if await self.store.transition(batch_id, (RUNNING,), status, changes):
            await self._settled(self._ended(job, f"{status}: {job.pages_done} lines"))

    async def _fail(self, job: Job, errors: list[dict[str, Any]]) -> None:
        """The batch failed (at validation, or the store lost its input)."""
        now = time.time()
        extra = {**job.extra, "failed_at": now, "errors": {"object": "list", "data": errors}}
        changes = {"extra": extra, "finished_at": now, "expires_at": now + self._settings.job_ttl}
        if await self.store.transition(job.id, (RUNNING,), FAILED, changes):
            await self._settled(self._ended(job, f"failed: {errors[0]['code']}"))

    async def _ended(self, job: Job, how: str) -> None:
        """A batch that reached its end: its input dropped, its unanswered lines given back
        (no line runs any more, so the store's counts are final)."""
        await self.store.drop_document(job.id)
        await self.release(await self.store.get(job.id) or job)
        log.info("batch %s %s", job.id, how)

    def _after_cancel(self, batch_id: str) -> None:
        task = asyncio.create_task(self.finish_cancelled(batch_id))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def finish_cancelled(self, batch_id: str) -> None:
        """A cancelled batch's finished lines in its files, then `cancelled`."""
        job = await self.store.get(batch_id)
        if job is None or job.status != CANCELLED or "cancelled_at" in job.extra:
            return
        ttl = self._settings.job_ttl
        chunks = self.store.page_chunks(batch_id)
        output, errors = await write_files(self.files, batch_id, job.owner, chunks, ttl=ttl)
        now = time.time()
        extra = {**job.extra, "cancelled_at": now, "output_file_id": output}
        extra["error_file_id"] = errors
        changes = {"extra": extra, "finished_at": now, "expires_at": now + ttl}
        if await self.store.transition(batch_id, (CANCELLED,), CANCELLED, changes):
            await self.store.drop_document(batch_id)
            await self.release(job)  # no line is kept once cancelled: its counts are final
            log.info("batch %s cancelled: %d lines kept", batch_id, job.pages_done)

    async def sweep(self, now: float) -> None:
        """Batches and files past OCRVL_JOB_TTL are removed."""
        for job in await self.store.due(now):
            if job.status not in ACTIVE:
                await self.store.delete(job.id)
        for file_id in await self.files.due(now):
            await self.files.delete(file_id)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": None}


async def open_batches(
    settings: Settings,
    *,
    chats: Chats,
    jobs: Runner,
    documents: Preprocessor,
    stack: AsyncExitStack,
    meter: Meter | None = None,
) -> BatchRunner:
    """The batch store and file store opened, the runner started; all closed by `stack`."""
    store = open_store(settings, batches=True)
    await store.open()
    stack.push_async_callback(store.close)
    files = open_files(settings)
    await files.open()
    stack.push_async_callback(files.close)
    runner = BatchRunner(store, files, chats, jobs=jobs, documents=documents, meter=meter)
    await runner.start()
    stack.push_async_callback(runner.close)
    return runner
