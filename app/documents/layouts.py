"""The layout service's client: one page in, its layout boxes out (OCRVL_LAYOUT_URL).

Shaped like the backends (app/backends.py): every URL is probed on `GET /ready` each
OCRVL_HEALTH_INTERVAL seconds, and a page goes to the ready service with the fewest pages in
flight (ties take turns). A service that refuses the connection is marked down and the page
tries the next one. What cannot be served is a 503 `layout_unavailable` with `Retry-After`
(none ready, every one refused, a 5xx, no answer within OCRVL_LAYOUT_TIMEOUT): a page never
waits longer than that. The API (issue 36, docs/layout.md):

    POST {url}/v1/layout  {"images": ["data:image/jpeg;base64,…"], overrides…}
    200 {"results": [{"width", "height", "boxes": [{"cls_id", "label", "score",
         "coordinate": [x1, y1, x2, y2], "order", "polygon_points"?}],
         "angle"?, "image"?}]}

With `orientation` or `unwarp` asked, a result carries `angle` (orientation) and `image`, the
corrected page as a data URL, whenever the page changed; its size and boxes are that image's.
A service without the step's model answers 400 `model_not_loaded`: the option is not available
on this deployment (a 400 naming it, never a 5xx).

A page's POST goes over the relay's own HTTP/1.1 client (app/upstream.py): 0.76x the gateway's
CPU a layout-first page against httpx's (bench/results/README.md, `cpu-layout-client-2026-12-07`).
Probes (one a service every OCRVL_HEALTH_INTERVAL) use httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import orjson

from app.backends import describe
from app.closing import cancelled
from app.documents.blocks import Box
from app.documents.layout_options import LayoutOptions
from app.errors import InvalidRequest, LayoutUnavailable, UpstreamError, clip
from app.upstream import Upstream, trust

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from app.settings import Settings

log = logging.getLogger("ocrvl.layout")


@dataclass(slots=True)
class Endpoint:
    """One layout service URL, as its last probe saw it."""

    url: str
    healthy: bool = False
    problem: str = "not probed yet"
    in_flight: int = 0

    def mark_down(self, problem: str) -> None:
        """Out of rotation until a probe finds it ready again."""
        if self.healthy:
            log.warning("layout service %s is down: %s", self.url, problem)
        self.healthy, self.problem = False, problem


class LayoutService:
    """The configured layout services, probed in the background, balanced per page."""

    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        upstream: Upstream,
        *,
        timeout: float,
        interval: float,
        stages: Histogram | None = None,
    ) -> None:
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.timeout = timeout
        self.interval = interval
        self.stages = stages  # ocrvl_layout_stage_seconds, for the pipeline's pages (`timed`)
        self._client = client
        self._upstream = upstream
        self._turn = itertools.count()

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Time a page's `stage` of the layout pipeline (its body); a stage that raised is not
        counted."""
        began = time.monotonic()
        yield
        if self.stages is not None:
            self.stages.labels(stage).observe(time.monotonic() - began)

    def ready(self) -> bool:
        """Whether any service answered its last probe."""
        return any(endpoint.healthy for endpoint in self.endpoints)

    def readiness(self) -> dict[str, Any]:
        """The services' state as `/ready` reports it: `ready` (the URLs in rotation) or
        `down` (why)."""
        if self.ready():
            return {"status": "ready", "services": [e.url for e in self.endpoints if e.healthy]}
        return {"status": "down", "problem": self.problems()}

    def problems(self) -> str:
        """Why the services are not serving (messages, /ready)."""
        return "; ".join(f"{e.url}: {e.problem}" for e in self.endpoints if not e.healthy)

    def unavailable(self, why: str) -> LayoutUnavailable:
        """The 503 for a page that cannot have its layout now."""
        return LayoutUnavailable(
            f"{why}; retry after {self.retry_after()} s", retry_after=self.retry_after()
        )

    def retry_after(self) -> int:
        """Seconds until the next probe may find a service ready."""
        return max(math.ceil(self.interval), 1)

    async def probe(self, endpoint: Endpoint) -> None:
        """`GET /ready`: 200 puts the service in rotation, anything else takes it out."""
        try:
            response = await self._client.get(f"{endpoint.url}/ready", timeout=self.timeout)
        except httpx.HTTPError as exc:
            endpoint.mark_down(f"/ready: {describe(exc)}")
            return
        if response.status_code != 200:
            endpoint.mark_down(f"/ready answered {response.status_code}")
            return
        if not endpoint.healthy:
            log.info("layout service %s is ready", endpoint.url)
        endpoint.healthy, endpoint.problem = True, ""

    async def probe_all(self) -> None:
        """Probe every service once, concurrently."""
        await asyncio.gather(*(self.probe(endpoint) for endpoint in self.endpoints))

    async def watch(self) -> None:
        """Probe forever, every `interval` seconds (the lifespan runs this as a task)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.probe_all()

    def _pick(self, tried: set[str]) -> Endpoint | None:
        ready = [e for e in self.endpoints if e.healthy and e.url not in tried]
        if not ready:
            return None
        shift = next(self._turn) % len(ready)
        return min([*ready[shift:], *ready[:shift]], key=lambda e: e.in_flight)

    async def detect(
        self, image_url: str, size: tuple[int, int], options: LayoutOptions, request_id: str
    ) -> list[Box]:
        """The layout boxes of one page (`size`: its width and height as sent), in reading
        order; LayoutUnavailable (503) or UpstreamError (502, a malformed answer) otherwise."""
        return (await self.locate(image_url, size, options, request_id)).boxes

    async def locate(
        self, image_url: str, size: tuple[int, int], options: LayoutOptions, request_id: str
    ) -> Located:
        """`detect`, with what the service's preprocessing did to the page."""
        body = orjson.dumps({"images": [image_url], **options.service_overrides()})
        headers = {"content-type": "application/json", "x-request-id": request_id}
        tried: set[str] = set()
        while (endpoint := self._pick(tried)) is not None:
            tried.add(endpoint.url)
            endpoint.in_flight += 1
            try:
                status, content = await self._post(endpoint.url, body, headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                endpoint.mark_down(describe(exc))
                continue
            except (TimeoutError, httpx.TimeoutException):
                raise self.unavailable(
                    f"the layout service {endpoint.url} did not answer within "
                    f"{self.timeout:g} s (OCRVL_LAYOUT_TIMEOUT)"
                ) from None
            except httpx.HTTPError as exc:
                raise self.unavailable(
                    f"the layout service {endpoint.url} failed: {describe(exc)}"
                ) from None
            finally:
                endpoint.in_flight -= 1
            return _located(endpoint.url, status, content, size, self)
        why = self.problems() or "none is configured"
        raise self.unavailable(f"no layout service is ready ({why})")

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """`POST {url}/v1/layout`, answered within `timeout` (TimeoutError): status and body."""
        async with asyncio.timeout(self.timeout):
            path = f"{urlsplit(url).path}/v1/layout"
            response = await self._upstream.post(url, path, headers, body)
            try:
                content = b"".join([chunk async for chunk in response.aiter_raw()])
            finally:
                await response.aclose()
        return response.status_code, content


@dataclass(frozen=True, slots=True)
class Located:
    """One page's layout: its boxes, and the page they refer to when the service corrected
    it (`image`, a data URL, of `size`; `angle` when its orientation was classified)."""

    boxes: list[Box]
    size: tuple[int, int]
    angle: int | None = None
    image: str | None = None


def _located(
    url: str, status: int, content: bytes, size: tuple[int, int], service: LayoutService
) -> Located:
    """The boxes of the service's answer (and the corrected page), checked against the API."""
    if status >= 500:
        raise service.unavailable(f"the layout service {url} answered {status}: {_text(content)}")
    if status == 400 and b"model_not_loaded" in content:
        _not_loaded(content)
    if status != 200:
        raise UpstreamError(
            f"the layout service {url} refused the page ({status}): {_text(content)}",
            code="layout_failed",
        )
    try:
        result = orjson.loads(content)["results"][0]
        measured = (result["width"], result["height"])
        boxes = [_box(item) for item in result["boxes"]]
        angle, image = result.get("angle"), result.get("image")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise _malformed(url, str(exc)) from None
    if angle not in (None, 0, 90, 180, 270) or not isinstance(image, str | None):
        raise _malformed(url, f"its angle {angle!r} or its image is not the API's")
    turned = (size[1], size[0]) if angle in (90, 270) else size
    if image is None and measured != turned:
        raise _malformed(url, f"it measured the page {measured}, not {turned} (width, height)")
    if not all(type(v) is int and v > 0 for v in measured):
        raise _malformed(url, f"the page's size {measured} is no size")
    return Located(boxes, measured, angle, image)


def _text(content: bytes) -> str:
    return clip(content.decode("utf-8", errors="replace"))


def _not_loaded(content: bytes) -> None:
    """A step the service has no model for: the option is not available here (400)."""
    try:
        error = orjson.loads(content)["error"]
        param, message = str(error.get("param")), str(error.get("message"))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return
    raise InvalidRequest(
        f"`{param}` is not available on this deployment: {clip(message)}",
        param=param,
        code="preprocessing_unavailable",
    )


def _malformed(url: str, why: str) -> UpstreamError:
    return UpstreamError(
        f"the layout service {url} answered what its API does not say ({clip(why)})",
        code="layout_failed",
    )


def _box(item: dict[str, Any]) -> Box:
    x1, y1, x2, y2 = (float(v) for v in item["coordinate"])
    polygon = item.get("polygon_points")
    points = tuple((float(x), float(y)) for x, y in polygon) if polygon is not None else None
    order = item.get("order")
    if not isinstance(item["label"], str) or not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise ValueError(f"a box is malformed: {item!r}")
    return Box(
        int(item["cls_id"]), item["label"], float(item["score"]), (x1, y1, x2, y2),
        int(order) if order is not None else None, points,
    )  # fmt: skip


def choose(
    service: LayoutService | None,
    mode: str,
    options: LayoutOptions,
    *,
    waits: bool = False,
    task: str = "ocr",
) -> tuple[LayoutOptions | None, str | None]:
    """The pipeline a document runs: its layout options (None: each page read whole) and, when
    `auto` fell back to whole pages, why. `on` with no service configured is a 400; `on` with
    none ready a 503 (`waits`: a job's pages wait for one instead, as they wait for backends).
    `orientation` and `unwarp` run in the layout service: they make `auto` mean `on`, and are a
    400 with `off`. A `task` other than `ocr` (table, formula, chart, spotting, seal) is a
    whole-page prompt, which the layout pipeline never sends (each block goes with its label's):
    `auto` reads such pages whole, `on` is a 400 rather than a task dropped silently."""
    if options.preprocessing:
        name = "orientation" if options.orientation else "unwarp"
        if mode == "off":
            raise InvalidRequest(
                f"`{name}` runs in the layout pipeline and `layout` is off; send `layout=on` "
                f"(or auto), or leave `{name}` out",
                param=name,
                code="invalid_value",
            )
        mode = "on"
    if task != "ocr":
        if mode == "on":
            raise InvalidRequest(
                f"`task={task}` reads each page whole with its prompt, and the layout pipeline "
                f"(`layout=on`, `orientation`, `unwarp`) reads each block with its label's "
                f"prompt instead; send `layout=off` (or auto) for `task={task}`, or `task=ocr` "
                "with the layout",
                param="task",
                code="invalid_value",
            )
        return None, None
    if mode == "off":
        return None, None
    if service is None:
        if mode == "on":
            raise InvalidRequest(
                "`layout=on` needs a layout service and this gateway has none (OCRVL_LAYOUT_URL "
                "is unset); send `layout=off` (or `auto`) to read each page whole",
                param="layout",
                code="layout_not_configured",
            )
        return None, None
    if waits or service.ready():
        return options, None
    why = f"no layout service is ready ({service.problems()})"
    if mode == "on":
        raise service.unavailable(why)
    return None, f"{why}: each page was read whole"


async def open_layouts(
    settings: Settings, stack: AsyncExitStack, stages: Histogram | None = None
) -> LayoutService | None:
    """The layout services of OCRVL_LAYOUT_URL (None when unset), probed once and then every
    OCRVL_HEALTH_INTERVAL seconds until `stack` closes; `stages` times its pipeline's pages."""
    if not settings.layout_url:
        return None
    tls = trust(settings.upstream_ca_file)
    client = httpx.AsyncClient(
        verify=tls or True,
        timeout=httpx.Timeout(settings.layout_timeout, connect=settings.connect_timeout),
        # idle connections go after OCRVL_KEEPALIVE_EXPIRY (4 s), before the service's uvicorn
        # closes them (5 s by default, 75 s for ocrvl_layout): httpx's own 5 s raced uvicorn's,
        # and a probe that took a connection as the service closed it marked the service down
        limits=httpx.Limits(
            max_connections=settings.max_connections, keepalive_expiry=settings.keepalive_expiry
        ),
        trust_env=False,  # a host's HTTP_PROXY must not capture the pages
    )
    await stack.enter_async_context(client)
    upstream = Upstream(
        settings.max_connections, settings.keepalive_expiry, settings.connect_timeout, tls=tls
    )
    stack.callback(upstream.close)
    service = LayoutService(
        settings.layout_url, client, upstream, timeout=settings.layout_timeout,
        interval=settings.health_interval, stages=stages,
    )  # fmt: skip
    await service.probe_all()
    if not service.ready():
        log.warning("no layout service is ready yet: %s", service.problems())
    watcher = asyncio.create_task(service.watch(), name="LayoutService.watch")
    stack.push_async_callback(cancelled, watcher)
    return service
