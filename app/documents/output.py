"""The `/v1/ocr` answer: JSON, an NDJSON stream (a line per page as it finishes), or markdown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.documents.job import PageResult
from app.documents.page_markdown import page_markdown

NDJSON = "application/x-ndjson"
MARKDOWN = "text/markdown"


def negotiate(accept: str, stream: bool) -> str:
    """The answer's media type: NDJSON when asked for (or `stream`), markdown, else JSON."""
    accept = accept.lower()
    if stream or NDJSON in accept:
        return NDJSON
    if MARKDOWN in accept:
        return MARKDOWN
    return "application/json"


def total_usage(pages: list[PageResult]) -> dict[str, int]:
    """The token counts of every page that has them, summed."""
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for page in pages:
        for name in usage:
            usage[name] += int((page.usage or {}).get(name) or 0)
    return usage


def layout_fields(on: bool, fallback: str | None = None) -> dict[str, str]:
    """How the document's pages were read: `layout` on or off, and why `auto` fell back."""
    fields = {"layout": "on" if on else "off"}
    if fallback is not None:
        fields["layout_fallback"] = fallback
    return fields


def layout_headers(fields: dict[str, str]) -> dict[str, str]:
    """`layout_fields` as response headers (x-ocr-layout, x-ocr-layout-fallback)."""
    headers = {"x-ocr-layout": fields["layout"]}
    if "layout_fallback" in fields:
        reason = fields["layout_fallback"].encode("ascii", "replace").decode()
        headers["x-ocr-layout-fallback"] = reason.replace("\r", " ").replace("\n", " ")[:500]
    return headers


def document(
    model: str, pages: list[PageResult], layout: dict[str, str] | None = None
) -> dict[str, Any]:
    """The whole answer as one JSON object, pages in page order."""
    ordered = sorted(pages, key=lambda page: page.index)
    return {
        "model": model,
        **(layout or {}),
        "pages": [page.as_dict() for page in ordered],
        "usage": total_usage(ordered),
    }


def markdown(pages: list[PageResult]) -> str:
    """The pages' markdown (app/documents/page_markdown.py) joined in page order."""
    ordered = sorted(pages, key=lambda page: page.index)
    return "\n\n".join(page_markdown(page.as_dict()) for page in ordered) + "\n"


def summary_headers(pages: list[PageResult]) -> dict[str, str]:
    """Counts a client can read without parsing the body."""
    failed = sum(page.error is not None for page in pages)
    return {"x-ocr-pages": str(len(pages)), "x-ocr-pages-failed": str(failed)}


class PageStream(Response):
    """NDJSON: a `document` line, a `page` line per page as it finishes, a `summary` line."""

    media_type = NDJSON

    def __init__(
        self,
        model: str,
        numbers: list[int],
        pages: AsyncIterator[PageResult],
        cleanup: contextlib.AsyncExitStack,
        layout: dict[str, str] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        self.init_headers({**headers, **(layout_headers(layout) if layout else {})})
        self._layout = layout or {}
        self._model = model
        self._numbers = numbers
        self._pages = pages
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `receive` is not read here: one watcher (fanout.Disconnect) already reads it
        async with self._cleanup:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            head: dict[str, Any] = {"object": "ocr.document", "model": self._model}
            head |= {**self._layout, "pages": self._numbers}
            await self._line(send, head)
            done: list[PageResult] = []
            async for page in self._pages:
                done.append(page)
                await self._line(send, {"object": "ocr.page", **page.as_dict()})
            failed = sum(page.error is not None for page in done)
            summary = {"object": "ocr.summary", "pages": len(done), "failed": failed}
            if cached := sum(page.cached for page in done):  # the results cache answered these
                summary["cached"] = cached
            await self._line(send, {**summary, "usage": total_usage(done)})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _line(send: Send, value: dict[str, Any]) -> None:
        body = orjson.dumps(value) + b"\n"
        await send({"type": "http.response.body", "body": body, "more_body": True})
