"""A batch and a file as OpenAI's API shows them (`object: "batch"`, `object: "file"`)."""

from __future__ import annotations

from typing import Any

from app.store import Job
from app.store.base import CANCELLED, EXPIRED, FAILED, QUEUED, SUCCEEDED
from app.store.files import FileRecord

STAMPS = (
    "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
    "cancelling_at", "cancelled_at",
)  # fmt: skip


ENDED_AS = {QUEUED: "validating", SUCCEEDED: "completed", FAILED: "failed", EXPIRED: "expired"}


def status(batch: Job) -> str:
    """OpenAI's lifecycle, from the record's status and the stamps it has reached."""
    stamps = batch.extra
    if batch.status in ENDED_AS:
        return ENDED_AS[batch.status]
    if batch.status == CANCELLED:
        return "cancelled" if "cancelled_at" in stamps else "cancelling"
    if "finalizing_at" in stamps:
        return "finalizing"
    return "in_progress" if "in_progress_at" in stamps else "validating"


def batch_object(batch: Job) -> dict[str, Any]:
    """The `batch` object."""
    spec, extra = batch.spec, batch.extra
    failed = batch.pages_failed
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": spec["endpoint"],
        "errors": extra.get("errors"),
        "input_file_id": spec["input_file_id"],
        "completion_window": spec["completion_window"],
        "status": status(batch),
        "output_file_id": extra.get("output_file_id"),
        "error_file_id": extra.get("error_file_id"),
        "created_at": int(batch.created_at),
        "expires_at": int(spec["window_ends"]),
        **{stamp: _seconds(extra.get(stamp)) for stamp in STAMPS},
        "request_counts": {
            "total": batch.pages_total,
            "completed": batch.pages_done - failed,
            "failed": failed,
        },
        "metadata": spec.get("metadata"),
        "usage": {
            "input_tokens": batch.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": batch.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": batch.prompt_tokens + batch.completion_tokens,
        },
    }


def _seconds(value: float | None) -> int | None:
    return None if value is None else int(value)


def file_object(record: FileRecord) -> dict[str, Any]:
    """The `file` object."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": int(record.created_at),
        "expires_at": int(record.expires_at),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
    }
