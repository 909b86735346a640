"""The store's interface and the job record it keeps (both implementations share them)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import orjson

from app.errors import Overloaded

QUEUED, RUNNING = "queued", "running"
SUCCEEDED, FAILED, CANCELLED, EXPIRED = "succeeded", "failed", "cancelled", "expired"
ACTIVE = (QUEUED, RUNNING)
ENDED = (SUCCEEDED, FAILED, CANCELLED)
ID_PREFIX = "job_"
PAGE_CHUNK = 200  # pages read from the store at once when they are streamed


class StoreUnavailable(Overloaded):
    """The job store does not answer (Redis down): 503, try again shortly."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"the job store is unreachable ({why}); retry after {STORE_RETRY_AFTER} s",
            retry_after=STORE_RETRY_AFTER,
        )


STORE_RETRY_AFTER = 5


def new_job_id() -> str:
    """An unguessable id: 128 random bits (a guessed id finds nothing: 404)."""
    return ID_PREFIX + secrets.token_urlsafe(16)


@dataclass(slots=True)
class Job:
    """One job: who owns it, what to read (`spec`), and how far it got."""

    id: str
    owner: str  # the API key's name, never the key
    spec: dict[str, Any]  # what the runner needs: pages (0-based), task, model, dpi, file kind…
    pages_total: int
    document_bytes: int
    created_at: float
    status: str = QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None  # results (then the record) are removed at this time
    error: dict[str, Any] | None = None
    holder: str | None = None  # the gateway running it
    lease_until: float = 0.0  # past this, another gateway may take the job over
    pages_done: int = 0  # pages finished, failed ones included
    pages_failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # reserved for later record kinds

    def columns(self) -> dict[str, Any]:
        """The record as flat values: JSON text for the nested ones."""
        return {name: encoded(name, value) for name, value in asdict(self).items()}

    @classmethod
    def from_columns(cls, values: dict[str, Any]) -> Job:
        """The record back from `columns()` (or Redis's strings for them)."""
        kept: dict[str, Any] = {}
        for column in fields(cls):
            value = values.get(column.name)
            if value in (None, "", b""):
                continue
            if isinstance(value, bytes):
                value = value.decode()
            if column.name in NESTED:
                value = orjson.loads(value)
            elif column.name in NUMBERS:
                value = NUMBERS[column.name](value)
            kept[column.name] = value
        return cls(**kept)

    @property
    def usage(self) -> dict[str, int]:
        """Token counts of the pages finished so far."""
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


def encoded(name: str, value: Any) -> Any:
    """A column's value as stored: JSON text for the nested ones."""
    if name in NESTED and value is not None:
        return orjson.dumps(value).decode()
    return value


NESTED = ("spec", "error", "extra")
NUMBERS: dict[str, type[float] | type[int]] = {
    "created_at": float, "started_at": float, "finished_at": float, "expires_at": float,
    "lease_until": float, "pages_total": int, "document_bytes": int, "pages_done": int,
    "pages_failed": int, "prompt_tokens": int, "completion_tokens": int,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PageRecord:
    """One finished page: its number (1-based), the page as the API shows it, its counts."""

    number: int
    body: bytes  # the page's JSON, as /v1/ocr shows it
    failed: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Store(Protocol):
    """Jobs, their pages and documents. Every method is safe to call from several gateways at
    once (SQLite: processes on one data dir; Redis: replicas): status changes are
    compare-and-set, a page is kept once however often it is written."""

    where: str  # for logs and /ready, never a password

    async def open(self) -> None:
        """Connect or create; SQLite also takes over the jobs of a dead gateway."""

    async def close(self) -> None:
        """Release connections."""

    async def create(self, job: Job, document: Path) -> None:
        """Keep `job` (queued) and its document; `document` (a spooled file) is consumed."""

    async def get(self, job_id: str) -> Job | None:
        """The job, or None when there is none (never was, or removed)."""

    async def listing(self, owner: str, limit: int, after: str | None) -> list[Job]:
        """`owner`'s jobs, newest first, starting after job `after`."""

    async def active(self, owner: str) -> int:
        """`owner`'s jobs queued or running."""

    async def stored_bytes(self) -> int:
        """Bytes of documents kept now (every owner)."""

    async def claim(self, holder: str, now: float, lease: float) -> Job | None:
        """The oldest queued job, or a running one whose lease ran out, now leased to
        `holder` until `now + lease` (status running)."""

    async def renew(self, job_id: str, holder: str, until: float) -> bool:
        """Extend `holder`'s lease; False when it no longer holds the running job."""

    async def release(self, job_id: str, holder: str) -> None:
        """Give the lease up (shutdown): another gateway may take the job at once."""

    async def transition(
        self, job_id: str, before: tuple[str, ...], status: str, changes: dict[str, Any]
    ) -> bool:
        """Move the job from one of `before` to `status` with `changes` (columns), at once;
        False when its status was none of `before` (cancelled meanwhile, say)."""

    async def add_page(self, job_id: str, page: PageRecord) -> bool:
        """Keep a running job's page unless it is kept already; counts it once."""

    async def pages(self, job_id: str) -> list[bytes]:
        """The pages kept so far, in page order."""

    def page_chunks(self, job_id: str, size: int = PAGE_CHUNK) -> AsyncIterator[list[bytes]]:
        """The pages kept, in page order, `size` at a time (a batch's output, never whole)."""

    async def page_numbers(self, job_id: str) -> set[int]:
        """Numbers of the pages kept so far."""

    async def document(self, job_id: str, folder: Path) -> Path | None:
        """A local file with the job's document (copied into `folder` if need be)."""

    async def drop_document(self, job_id: str) -> None:
        """Remove the document (the last page is done, or the job was cancelled)."""

    async def drop_pages(self, job_id: str) -> None:
        """Remove the page results."""

    async def delete(self, job_id: str) -> None:
        """Remove the job: record, pages, document."""

    async def due(self, now: float) -> list[Job]:
        """Jobs whose `expires_at` has passed (ended or expired), for the TTL sweep."""
