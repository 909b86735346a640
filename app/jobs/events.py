"""The jobs' metrics and their access line (one per job event: never a key, never page text)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from app.metrics import LATENCY_BUCKETS, Metrics
from app.store import Job

log = logging.getLogger("ocrvl.access")


class JobEvents:
    """Counts jobs by the status they reach, pages by outcome, and logs each event."""

    def __init__(self, metrics: Metrics, background_waiting: Callable[[], int]) -> None:
        self.metrics = metrics  # the loop guard's stops of a job's pages count under "jobs"
        registry = metrics.registry
        self.metrics = metrics  # the gateway's own (the results cache's counters)
        self.jobs = Counter(
            "ocrvl_jobs", "Jobs that reached each status on this gateway.", ["status"],
            registry=registry,
        )  # fmt: skip
        self.running = Gauge(
            "ocrvl_jobs_running", "Jobs this gateway is running now.", registry=registry
        )
        self.waiting = Gauge(
            "ocrvl_job_pages_waiting",
            "Job pages waiting in the admission queue's background lane.",
            registry=registry,
        )
        self.waiting.set_function(lambda: float(background_waiting()))
        self.pages = Counter(
            "ocrvl_job_pages", "Job pages finished, by outcome.", ["outcome"], registry=registry
        )
        self.page_seconds = Histogram(
            "ocrvl_job_page_duration_seconds",
            "One job page from rendering to its stored answer (background-lane wait included).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._registry = registry

    def close(self) -> None:
        """Take the jobs' metrics out of the registry (a lifespan may run again)."""
        for collector in (self.jobs, self.running, self.waiting, self.pages, self.page_seconds):
            self._registry.unregister(collector)

    def event(self, job: Job, event: str, status: str | None = None, **facts: object) -> None:
        """One access line for `event` of `job` (and a count when it reached a status)."""
        if status is not None:
            self.jobs.labels(status).inc()
        log.info(
            "job",
            extra={
                "job_id": job.id,
                "key": job.owner,  # the key's name, never the key
                "event": event,
                "status": status or job.status,
                "pages_total": job.pages_total,
                **facts,
            },
        )
