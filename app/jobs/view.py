"""A job and its kept pages as the API shows them (the pages in /v1/ocr's own forms)."""

from __future__ import annotations

from typing import Any

import orjson

from app.documents.job import PageResult
from app.errors import GatewayError
from app.store import Job


class KeptError(GatewayError):
    """A page's error as it was kept: shown again exactly as it was."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__(str(fields.get("message") or "the page failed"))
        self._fields = fields

    def body(self) -> dict[str, Any]:
        """The kept OpenAI-shaped error."""
        return {"error": self._fields}


def job_object(job: Job) -> dict[str, Any]:
    """The `ocr.job` object."""

    def seconds(value: float | None) -> int | None:
        return None if value is None else int(value)

    return {
        "id": job.id,
        "object": "ocr.job",
        "status": job.status,
        "model": job.spec.get("served_model"),
        "task": job.spec.get("task"),
        "layout": "on" if job.spec.get("layout") else "off",
        "pages_total": job.pages_total,
        "pages_done": job.pages_done,
        "pages_failed": job.pages_failed,
        "created_at": seconds(job.created_at),
        "started_at": seconds(job.started_at),
        "finished_at": seconds(job.finished_at),
        "expires_at": seconds(job.expires_at),
        "usage": job.usage,
        "error": job.error,
        "callback_url": job.spec.get("callback_url"),
    }


def page_results(bodies: list[bytes]) -> list[PageResult]:
    """Kept pages back as PageResults, so /v1/ocr's output functions show them."""
    pages = []
    for body in bodies:
        shown = orjson.loads(body)
        error = shown.get("error")
        pages.append(
            PageResult(
                shown["index"],
                shown.get("text"),
                shown.get("finish_reason"),
                shown.get("usage"),
                shown.get("html"),
                error=KeptError(error) if isinstance(error, dict) else None,
                image=shown.get("image"),
                markdown=shown.get("markdown"),
                blocks=shown.get("blocks"),
                images=shown.get("images"),
                cached=shown.get("cached") is True,
                empty=shown.get("empty"),
            )
        )
    return pages
