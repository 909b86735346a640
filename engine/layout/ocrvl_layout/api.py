"""The HTTP API (docs/layout.md): POST /v1/layout, /health, /ready, /metrics; the lifespan that
owns the model (and its CUDA graphs), the batcher, the worker threads, the worker processes and
the page slots they share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from ocrvl_layout.batcher import Batcher
from ocrvl_layout.detections import Candidates
from ocrvl_layout.errors import (
    ClientClosed,
    InvalidRequest,
    LayoutError,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    error_body,
    install_handlers,
)
from ocrvl_layout.metrics import Metrics
from ocrvl_layout.model import BatchPage, LayoutModel
from ocrvl_layout.options import LayoutOptions, LayoutRequest, parse_request
from ocrvl_layout.pages import decode, finish, prepare, prepare_into
from ocrvl_layout.preprocess import Corrected, Preprocessor
from ocrvl_layout.settings import Settings
from ocrvl_layout.slots import PageSlots, probe, slots_for
from ocrvl_layout.workers import Workers, default_processes

log = logging.getLogger("ocrvl_layout")


def warm_up_sizes(max_batch: int, *, compiled: bool) -> tuple[int, ...]:
    """The batch sizes the warm-up runs before the service says it is ready. Eager: one page.
    Compiled: every size a batch can have, 1 and the largest first (torch compiles the second
    with the batch dimension dynamic), so no size is first met under load: on the H200 the first
    batch of 2 after a warm-up of 1 and 8 held every request 130 s (thirteenth pass,
    docs/h200.md), far past the gateway's 30 s layout timeout."""
    if not compiled:
        return (1,)
    return tuple(dict.fromkeys((1, max_batch, *range(2, max_batch))))


class Service:
    """Everything the routes use: settings, metrics, and (once loaded) the model and batcher."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.model: LayoutModel | None = None
        self.preprocessor: Preprocessor | None = None
        self.batcher: Batcher | None = None
        self.failure: str | None = None
        self.pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="layout-work")
        self.workers: Workers | None = None
        self.slots: PageSlots | None = None

    async def load(self) -> str:
        """Load and warm the model (in a thread), then start batching; a line saying what runs."""
        settings, loop = self.settings, asyncio.get_running_loop()
        model = await loop.run_in_executor(
            None, lambda: LayoutModel(settings.model, settings.device, compile=settings.compile)
        )
        preprocessor = await loop.run_in_executor(
            None,
            lambda: Preprocessor(
                settings.orientation_model, settings.unwarping_model, model.device, model.dtype
            ),
        )
        sizes = warm_up_sizes(settings.max_batch, compiled=settings.compile)
        seconds = await loop.run_in_executor(None, model.warm_up, sizes)
        await loop.run_in_executor(
            None, lambda: model.capture(settings.max_batch, wanted=settings.cuda_graphs)
        )
        await loop.run_in_executor(None, preprocessor.warm_up)
        processes = settings.worker_processes
        if processes is None:
            processes = default_processes()
        if processes:
            self.workers = Workers(processes, self.metrics.worker_restarts)
            log.info("%d worker processes: pids %s", processes, await self.workers.start())
            self.slots = await self._slots(model, self.workers)
        self.batcher = Batcher(
            model,
            self.metrics,
            max_batch=settings.max_batch,
            max_wait=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue,
        )
        self.batcher.start()
        self.model, self.preprocessor = model, preprocessor
        self.metrics.ready.set(1)
        steps = preprocessor.describe()
        return f"{model.describe()}{', ' + steps if steps else ''}, warm-up {seconds:.1f} s"

    async def _slots(self, model: LayoutModel, workers: Workers) -> PageSlots | None:
        """Page slots the workers resize into, once a worker has mapped them; None (pages
        pickled back, logged) where this system does not let it."""
        prep = model.preprocessing
        slots = PageSlots(slots_for(self.settings.max_batch, workers.processes),
                          (prep.height, prep.width, 3))  # fmt: skip
        try:
            await workers.call(probe, slots.address)
        except OSError as error:
            log.warning("the worker processes cannot map the page slots (%s): pages come back "
                        "pickled", error)  # fmt: skip
            slots.close()
            return None
        log.info("%d page slots of %dx%d shared with the workers", slots.address.count,
                 prep.width, prep.height)  # fmt: skip
        return slots

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()
        if self.workers is not None:
            await self.workers.close()
        if self.slots is not None:
            self.slots.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def ready(self) -> tuple[LayoutModel, Batcher]:
        """The model and batcher, or NotReady while they load."""
        if self.model is None or self.batcher is None:
            reason = f"failed to load: {self.failure}" if self.failure else "loading"
            raise NotReady(f"the layout model is not ready ({reason})", retry_after=5)
        return self.model, self.batcher

    async def in_pool(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, function, *args)


def service_of(request: Request) -> Service:
    service: Service = request.state.service
    return service


ServiceDep = Annotated[Service, Depends(service_of)]


def create_app(
    settings: Settings,
    *,
    on_ready: Callable[[str], None] | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The layout service; `on_ready` hears when it is warm, `on_fatal` when loading failed."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Any]]:
        service = Service(settings)

        async def load() -> None:
            try:
                line = await service.load()
            except Exception as error:
                service.failure = str(error)
                log.exception("the layout model failed to load from %s", settings.model)
                if on_fatal is not None:
                    on_fatal(error)
                return
            log.info("ready: %s", line)
            if on_ready is not None:
                on_ready(line)

        loading = asyncio.create_task(load(), name="layout-load")
        try:
            yield {"service": service}
        finally:
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
            await service.close()

    app = FastAPI(title="ocrvl-layout", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_handlers(app)
    app.add_exception_handler(Exception, _unexpected)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/v1/layout", layout, methods=["POST"])
    return app


async def _unexpected(_: Request, error: Exception) -> Response:
    log.error("unexpected error", exc_info=error)
    body = error_body(f"internal error: {type(error).__name__}", "server_error", None, None)
    return JSONResponse(body, status_code=500)


async def health(service: ServiceDep) -> Response:
    """Alive: 200 while the process serves (503 once the model failed to load)."""
    if service.failure:
        body = error_body(
            f"the model failed to load: {service.failure}", "server_error", None, "model_failed"
        )
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok"})


async def ready(service: ServiceDep) -> Response:
    """200 once the model is loaded and warm, 503 before."""
    model, _ = service.ready()
    return JSONResponse({"status": "ready", "model": model.describe()})


async def metrics(service: ServiceDep) -> Response:
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def layout(request: Request, service: ServiceDep) -> Response:
    """Each image's final layout boxes, in reading order (docs/layout.md)."""
    outcome = "error"
    try:
        response = await _layout(request, service)
    except (InvalidRequest, PayloadTooLarge):
        outcome = "invalid"
        raise
    except Overloaded:
        outcome = "overloaded"
        raise
    except ClientClosed:
        outcome = "closed"
        raise
    except NotReady:
        outcome = "not_ready"
        raise
    else:
        outcome = "ok"
        return response
    finally:
        service.metrics.requests.labels(outcome=outcome).inc()


async def _layout(request: Request, service: ServiceDep) -> Response:
    model, batcher = service.ready()
    settings = service.settings
    body = await _read_body(request, settings.max_request_bytes)
    try:
        document = await service.in_pool(json.loads, body)
    except (ValueError, RecursionError) as error:
        raise InvalidRequest(f"the body is not JSON: {error}", code="invalid_json") from None
    parsed = parse_request(document, num_labels=len(model.labels), max_images=settings.max_images)
    preprocessing = parsed.orientation or parsed.unwarp
    if preprocessing and service.preprocessor is not None:
        service.preprocessor.require(parsed.orientation, parsed.unwarp)
    with batcher.admitted(len(parsed.images)):  # before decoding: shed load at once
        started = time.monotonic()
        # worker processes, unless the preprocessing models (here) need the full-size pixels
        workers = None if preprocessing else service.workers
        corrected = None
        if workers is None:
            pages, corrected = await _in_threads(service, model, batcher, parsed)
            found = await batcher.run(pages)
        else:
            found = await _in_workers(service, workers, parsed)
    labels, options = model.labels, parsed.options
    run = service.in_pool if workers is None else workers.call
    results = await asyncio.gather(*(run(finish, page, labels, options) for page in found))
    if corrected is not None:  # each page's angle and corrected image (a PNG: in a thread)
        shown = await asyncio.gather(*(service.in_pool(page.shown) for page in corrected))
        results = [result | extra for result, extra in zip(results, shown, strict=True)]
    log.debug("%d pages in %.3f s", len(results), time.monotonic() - started)
    return JSONResponse({"results": results})


async def _in_workers(
    service: Service, workers: Workers, parsed: LayoutRequest
) -> list[Candidates]:
    """Each page decoded and resized in a worker process, then the request's pages batched
    together: their candidates. Pages are resized into page slots (slots.py), a request's all at
    once (as many at a time as there are slots); without slots they are pickled back."""
    model, batcher = service.ready()
    threshold, slots = _batch_threshold(parsed.options), service.slots
    limit, images = service.settings.max_pixels, parsed.images
    if slots is None:
        size = (model.preprocessing.width, model.preprocessing.height)
        prepared = await asyncio.gather(
            *(workers.call(prepare, url, i, limit, size) for i, url in enumerate(images))
        )
        pages = [BatchPage(page.pixels, page.width, page.height, threshold) for page in prepared]
        return await batcher.run(pages)
    most = slots.address.count
    parts = await asyncio.gather(
        *(
            _in_slots(service, slots, workers, list(enumerate(images))[start : start + most],
                      threshold)
            for start in range(0, len(images), most)
        )
    )  # fmt: skip
    return [found for part in parts for found in part]


async def _in_slots(
    service: Service,
    slots: PageSlots,
    workers: Workers,
    images: list[tuple[int, str]],
    threshold: float,
) -> list[Candidates]:
    """Pages resized into slots of their own, then run: their candidates. The slots go back
    once no worker writes them (a request that ends early waits for its writers in the
    background: a slot taken again while a worker still wrote into it would mix two pages)."""
    _, batcher = service.ready()
    limit, taken = service.settings.max_pixels, await slots.acquire(len(images))
    writes = asyncio.gather(
        *(
            workers.call(prepare_into, url, index, limit, slots.address, slot)
            for (index, url), slot in zip(images, taken, strict=True)
        ),
        return_exceptions=True,
    )
    try:
        sizes = await asyncio.shield(writes)
        for size in sizes:  # the first failing page, in the request's order
            if isinstance(size, BaseException):
                raise size
        pages = [BatchPage(slots.view(slot), width, height, threshold)
                 for slot, (width, height) in zip(taken, sizes, strict=True)]  # fmt: skip
        return await batcher.run(pages)
    finally:  # the pass has read them (or the request is gone, and its answer with it)
        writes.add_done_callback(lambda _: slots.release(taken))


async def _in_threads(
    service: Service, model: LayoutModel, batcher: Batcher, parsed: LayoutRequest
) -> tuple[list[BatchPage], list[Corrected]]:
    """Each page decoded in a worker thread, corrected by the preprocessing models the request
    asks for (in the forward thread), resized in a worker thread."""
    settings = service.settings
    pixels = await asyncio.gather(
        *(
            service.in_pool(decode, url, i, settings.max_pixels)
            for i, url in enumerate(parsed.images)
        )
    )
    corrected = [Corrected(page, None, False) for page in pixels]
    if (parsed.orientation or parsed.unwarp) and service.preprocessor is not None:
        corrected = []
        for start in range(0, len(pixels), batcher.max_batch):  # at most a layout batch a pass
            corrected += await batcher.exclusive(
                service.preprocessor.correct, pixels[start : start + batcher.max_batch],
                parsed.orientation, parsed.unwarp,
            )  # fmt: skip
    pages = await asyncio.gather(
        *(service.in_pool(_prepare, model, page.pixels, parsed.options) for page in corrected)
    )
    return list(pages), corrected


def _batch_threshold(options: LayoutOptions) -> float:
    """transformers' post-processing threshold for a page: PaddleX gives it 0.0 when thresholds
    are per class (DetTransformersPredictor._get_hf_threshold) and applies them itself after."""
    return 0.0 if isinstance(options.threshold, dict) else options.threshold


def _prepare(model: LayoutModel, pixels: Any, options: LayoutOptions) -> BatchPage:
    """A decoded page resized for the model (a worker thread)."""
    height, width = pixels.shape[:2]
    return BatchPage(model.preprocessing.resize(pixels), width, height, _batch_threshold(options))


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"the body is {declared} bytes; at most {limit} (--max-request-bytes)"
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the body is over {limit} bytes (--max-request-bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientClosed(f"the client closed the connection after {size} bytes") from None
    return b"".join(chunks)


__all__ = ["LayoutError", "Service", "create_app"]
