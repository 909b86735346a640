"""The results cache as the pipeline consults it: a page's key, its answer kept and read back.

Before a page asks for work (the layout service, the engine), its content is hashed in a worker
and looked up under everything that decides its answer; a hit is the page as it was answered,
marked `cached`, with nothing sent anywhere. The key (SHA-256) is made of:

    the API key's name            a hit never tells one key what another has read
    the page's content            the JPEG the model reads (whole pages), or the page's pixels
                                  at its dpi (with a layout: the crops are cut from them)
    the served model              its name, its /v1/models `root` (the checkpoint) and length
    the options                   task, layout options, pixel bounds, sampling fields,
                                  max_tokens as sent
    PIPELINE_VERSION              bumped whenever the same input would be answered differently

A laid-out page's hash is of its pixels, which the worker that renders them also keeps in a
file for a miss to be laid out and cut from (app/documents/workers.py, `Held`), as a page
read whole hands its rendered JPEG on: a miss is rasterised once, and a hit lets them go. After
a hit, the document's next page keeps none (a document sent again: its hits pay nothing for a
miss's sake, a miss among them is rendered again for its layout).

Only pages that were answered whole are kept: a failed page, or a page with a block that
failed, is read again next time. The store (app/store/results.py) is the job store's: SQLite
in the data dir, or Redis for replicas. A cache that does not answer is a miss, never an error.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from app.documents.blocks import Box
from app.documents.digests import laid_out_page, whole_page
from app.documents.errors import DocumentError
from app.documents.job import PROMPTS, OcrJob, PageResult
from app.documents.raster import RenderedPage
from app.documents.workers import Held, Preprocessor
from app.metrics import Metrics
from app.store.results import ResultsCache

log = logging.getLogger("ocrvl.cache")
PIPELINE_VERSION = 1  # bump when the pipeline answers the same page differently
# what a page's answer is made of (its number and `image` are the request's); `corrected` and
# `size` are the page the layout service turned or flattened, which /layout-parsing draws on
KEPT = (
    "text", "finish_reason", "usage", "html", "markdown", "blocks", "images", "empty",
    "spotting", "angle", "corrected", "size", "stopped", "loop",
)  # fmt: skip
# the page's reading, given what hashing it rendered: the page read whole, or a laid-out page's
# pixels (held for its layout page and its crops, so that a miss is rasterised once)
Work = Callable[[RenderedPage | None, Held], Awaitable[PageResult]]


def options_of(job: OcrJob, model_entry: dict[str, Any] | None) -> dict[str, Any]:
    """Everything but the page and the key that decides a page's answer."""
    entry = model_entry or {}
    return {
        "version": PIPELINE_VERSION,
        "model": job.model,
        "revision": [entry.get("root"), entry.get("parent"), entry.get("max_model_len")],
        "task": PROMPTS[job.task],
        "layout": job.layout.as_dict() if job.layout is not None else None,
        "pixels": [job.source.dpi, job.source.min_pixels, job.source.max_pixels],
        "sampling": job.sampling,
        "max_tokens": [job.max_tokens, job.model_len],  # what the page asks for (fanout)
        "loops": job.loops,  # cut, retry or off: the loop guard's answer differs
    }


@dataclass(slots=True)
class PageCache:
    """One document's view of the cache: its key's scope and its options, hashed once."""

    store: ResultsCache
    prefix: bytes  # the key's name and the options, as the start of every page's key
    metrics: Metrics  # ocrvl_cache_hits_total, ocrvl_cache_misses_total
    # the document's last page looked up was a hit: its next page is likely one too (a document
    # sent again), so its hash keeps no pixels for a miss's reading, which a hit pays ~3 ms for
    hit_last: bool = False

    @classmethod
    def scoped(
        cls, store: ResultsCache, key_name: str | None, options: dict[str, Any], metrics: Metrics
    ) -> PageCache:
        """The cache of `key_name`'s pages read with `options` (`options_of`)."""
        scope = [key_name or "anonymous", options]
        digest = hashlib.sha256(orjson.dumps(scope, option=orjson.OPT_SORT_KEYS, default=repr))
        return cls(store, digest.digest(), metrics)

    def key(self, digest: str) -> str:
        """The cache key of the page whose content hash is `digest`."""
        return hashlib.sha256(self.prefix + digest.encode()).hexdigest()

    async def page(
        self, job: OcrJob, index: int, preprocessor: Preprocessor, work: Work
    ) -> PageResult:
        """Page `index` from the cache, or from `work(the page rendered, if it was)`, kept."""
        number = index + 1
        try:
            if job.layout is None:
                digest, rendered = await preprocessor.run(whole_page, job.source, index)
                image, held = rendered.url, Held()
            else:
                rendered = None
                keep = not self.hit_last
                digest, image, held = await _laid_out(job, index, preprocessor, keep)
        except DocumentError as exc:
            return PageResult(number, error=exc.as_gateway_error())
        with held:  # a hit lets the pixels go; a miss's reading takes them
            key = self.key(digest)
            body = await self._get(key)
            self.hit_last = body is not None
            if body is not None:
                self.metrics.cache_hits.inc()
                found = answered(number, body)
                found.image = image if job.page_images else None
                return found
            self.metrics.cache_misses.inc()
            result = await work(rendered, held)
        if keepable(result):
            await self._put(key, kept(result))
        return result

    async def _get(self, key: str) -> bytes | None:
        try:
            return await self.store.get(key, time.time())
        except Exception as exc:  # a cache outage is a miss: the page is read
            log.warning("results cache %s: not read (%s)", self.store.where, exc)
            return None

    async def _put(self, key: str, body: bytes) -> None:
        try:
            await self.store.put(key, body, time.time())
        except Exception as exc:  # the answer goes out all the same
            log.warning("results cache %s: not written (%s)", self.store.where, exc)


async def _laid_out(
    job: OcrJob, index: int, preprocessor: Preprocessor, keep: bool
) -> tuple[str, str | None, Held]:
    """A laid-out page's hash, its JPEG when asked, and (`keep`) its pixels held for a miss's
    reading: without them, a miss renders the page again for its layout."""
    args = (laid_out_page, job.source, index, job.page_images)
    if not keep:
        (digest, image), _ = await preprocessor.run(*args)
        return digest, image, Held()
    (digest, image), held = await preprocessor.keeping(*args)
    held.url = image if held.pixels is not None else None
    return digest, image, held


def keepable(result: PageResult) -> bool:
    """Whether the page was answered whole (no error on it nor on any of its blocks)."""
    if result.error is not None:
        return False
    return not any("error" in block for block in result.blocks or ())


def kept(result: PageResult) -> bytes:
    """The page's answer as the cache keeps it (its number and image are the request's)."""
    shown = {name: getattr(result, name) for name in KEPT}
    if result.boxes is not None:
        shown["boxes"] = [
            [b.cls_id, b.label, b.score, b.coordinate, b.order, b.polygon] for b in result.boxes
        ]
    return orjson.dumps(shown)


def answered(number: int, body: bytes) -> PageResult:
    """Page `number` as the cache kept it, marked cached."""
    shown = orjson.loads(body)
    boxes = shown.pop("boxes", None)
    if shown.get("size") is not None:
        shown["size"] = tuple(shown["size"])
    result = PageResult(number, cached=True, **shown)
    if boxes is not None:
        result.boxes = [
            Box(cls_id, label, score, tuple(coordinate), order,
                tuple(tuple(point) for point in polygon) if polygon is not None else None)
            for cls_id, label, score, coordinate, order, polygon in boxes
        ]  # fmt: skip
    return result


def wanted(cache_control: str | None, field: bool) -> bool:
    """Whether the request lets the cache answer: not with `Cache-Control: no-cache` (or
    no-store), nor with the `cache` field false."""
    directives = {part.strip().lower() for part in (cache_control or "").split(",")}
    return field and not directives & {"no-cache", "no-store"}


def state(pages: list[PageResult], consulted: bool) -> str:
    """The answer's `x-ocrvl-cache`: hit (every page cached), miss (none), partial, or bypass
    (the request did not let the cache answer)."""
    if not consulted:
        return "bypass"
    cached = sum(page.cached for page in pages)
    return "hit" if pages and cached == len(pages) else "partial" if cached else "miss"


async def sweeping(store: ResultsCache, metrics: Metrics, interval: float) -> None:
    """Hold the TTL and the size cap every `interval` seconds, and export the size."""
    while True:
        try:
            size = await store.sweep(time.time())
        except Exception as exc:  # tried again at the next sweep
            log.warning("results cache %s: not swept (%s)", store.where, exc)
        else:
            metrics.cache_entries.set(size.entries)
            metrics.cache_bytes.set(size.bytes)
        await asyncio.sleep(interval)
