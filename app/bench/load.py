"""The closed loop: exactly C requests in flight, a warm-up, then a measured window.

Each of C workers sends a page, waits for the whole answer and sends the next, so C requests are
in flight until the level ends. Workers start spread over `ramp` seconds, so that
requests of equal length do not move in lock-step waves. The first `warmup` completions are not
measured; the window
starts at the last of them and ends when `requests` completions were measured, `duration` passed
or the level's pages ran out. Requests still in flight then are cancelled (the client
disconnects, so vLLM aborts them) and not counted.

Each worker has an HTTP client of its own, with one connection. One client shared by C workers
spends its time in httpcore's connection pool, which walks every connection and every queued
request (with a readability poll per connection) on each request and each response: at C = 256
that was 81 % of the load generator's CPU, 30 ms per request, and it answered 12-14 pages/s of a
backend that gives 25.6 (bench/results/README.md, the seventh H200 pass).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from app.bench.corpus import Page

PROMPTS = {  # PaddleOCR-VL's task prompts, as PaddleOCR's pipeline client sends them
    "ocr": "OCR:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
    "chart": "Chart Recognition:",
}
HOLE = "@@page@@"
LAG_TICK = 0.05  # seconds between looks at how late the load generator's event loop runs
MM_PROCESSOR_KWARGS = {"min_pixels": 112896, "max_pixels": 1003520}  # PaddleOCR's own bounds


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint under test."""

    label: str
    url: str  # base URL, without /v1
    key: str
    model: str


@dataclass(frozen=True, slots=True)
class Shape:
    """What each request asks for."""

    task: str = "ocr"
    max_tokens: int = 1024
    ignore_eos: bool = False
    stream: bool = False

    def body(self, page: Page, model: str) -> bytes:
        """The chat completion body PaddleOCR's client would send for `page`."""
        head, tail = _template(self, model, page.mime)
        return b"".join((head, page.b64, tail))  # no JSON encoding of the image per request


@functools.lru_cache(maxsize=64)
def _template(shape: Shape, model: str, mime: str) -> tuple[bytes, bytes]:
    """The body around the image's base64, split where it goes."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{HOLE}"}},
                    {"type": "text", "text": PROMPTS[shape.task]},
                ],
            }
        ],
        "max_completion_tokens": shape.max_tokens,
        "temperature": 0,
        "skip_special_tokens": True,
        "mm_processor_kwargs": MM_PROCESSOR_KWARGS,
    }
    if shape.ignore_eos:
        payload["ignore_eos"] = True  # vLLM's: random weights then write max_tokens tokens
    if shape.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    head, tail = orjson.dumps(payload).split(HOLE.encode())
    return head, tail


def auth(key: str) -> dict[str, str]:
    """The authorization header for `key`; none for an empty key (an open vLLM)."""
    return {"authorization": f"Bearer {key}"} if key else {}


@dataclass(slots=True)
class Outcome:
    """One request: when it ran, how it ended and what it produced."""

    start: float
    end: float
    status: int | str  # an HTTP status, or the transport error's name
    tokens: int = 0
    ttft: float | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True, slots=True)
class Plan:
    """How long a level runs."""

    concurrency: int
    warmup: int
    requests: int | None = None
    duration: float | None = None
    ramp: float = 0.0  # seconds over which the C workers start, evenly spaced


@dataclass(slots=True)
class LevelRun:
    """What a level measured."""

    outcomes: list[Outcome] = field(default_factory=list)
    started: float = 0.0  # the measured window
    ended: float = 0.0
    ended_by: str = ""  # requests, duration or pages
    cpu_seconds: float = 0.0  # the load generator's own CPU time during the window
    # how late each LAG_TICK sleep woke during the window: a busy load generator delays every
    # send and every read, and its latencies then include its own queue
    loop_lags: list[float] = field(default_factory=list)


async def send(client: httpx.AsyncClient, target: Target, body: bytes, stream: bool) -> Outcome:
    """One request, timed; errors become the outcome's status, never an exception."""
    headers = {"content-type": "application/json"} | auth(target.key)
    url = f"{target.url}/v1/chat/completions"
    start = time.perf_counter()
    outcome = Outcome(start, start, 0)
    try:
        if stream:
            await _streamed(client, url, headers, body, outcome)
        else:
            response = await client.post(url, content=body, headers=headers)
            outcome.status = response.status_code
            if response.status_code == 200:
                outcome.tokens = orjson.loads(response.content)["usage"]["completion_tokens"]
            else:
                outcome.message = response.text[:300]
    except httpx.TimeoutException as exc:
        outcome.status, outcome.message = "timeout", repr(exc)[:300]
    except (httpx.HTTPError, orjson.JSONDecodeError, KeyError) as exc:
        outcome.status, outcome.message = type(exc).__name__, str(exc)[:300]
    outcome.end = time.perf_counter()
    return outcome


async def _streamed(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes, outcome: Outcome
) -> None:
    async with client.stream("POST", url, content=body, headers=headers) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            outcome.message = (await response.aread()).decode(errors="replace")[:300]
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if outcome.ttft is None and '"content":"' in line and '"content":""' not in line:
                outcome.ttft = time.perf_counter() - outcome.start
            if '"completion_tokens"' in line:  # the usage chunk (stream_options.include_usage)
                usage = orjson.loads(line[6:]).get("usage") or {}
                outcome.tokens = usage.get("completion_tokens", outcome.tokens)


async def _lateness(measuring: asyncio.Event, lags: list[float]) -> None:
    """From the window's start until cancelled: how late each LAG_TICK sleep wakes."""
    await measuring.wait()
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_TICK)
        lags.append(max(0.0, time.perf_counter() - before - LAG_TICK))


async def run_level(
    connect: Callable[[], httpx.AsyncClient],
    target: Target,
    *,
    shape: Shape,
    pages: Iterator[Page],
    plan: Plan,
    progress: Callable[[list[Outcome]], None] | None = None,
) -> LevelRun:
    """Keep `plan.concurrency` requests in flight until the level's window closes."""
    run = LevelRun()
    stop, measuring = asyncio.Event(), asyncio.Event()
    warm = 0
    cpu_start = 0.0

    def finish(reason: str) -> None:
        if not stop.is_set():
            run.ended, run.ended_by = time.perf_counter(), reason
            run.cpu_seconds = time.process_time() - cpu_start
            stop.set()

    async def worker(index: int) -> None:
        # Staggered starts: with fixed answer lengths, C requests started together stay in
        # lock-step waves forever, and a window then counts whole waves, not a steady rate.
        await asyncio.sleep(plan.ramp * index / plan.concurrency)
        async with connect() as client:  # its own connection (see the module's docstring)
            await requests(client)

    async def requests(client: httpx.AsyncClient) -> None:
        nonlocal warm, cpu_start
        while not stop.is_set():
            page = next(pages, None)
            if page is None:
                finish("pages")
                return
            outcome = await send(client, target, shape.body(page, target.model), shape.stream)
            if stop.is_set():
                return
            if not run.started:
                warm += 1
                if warm >= plan.warmup:
                    run.started, cpu_start = outcome.end, time.process_time()
                    measuring.set()
                continue
            run.outcomes.append(outcome)
            if progress:
                progress(run.outcomes)
            if plan.requests and len(run.outcomes) >= plan.requests:
                finish("requests")

    async def timer() -> None:
        await measuring.wait()
        assert plan.duration is not None  # noqa: S101 (only started with a duration)
        await asyncio.sleep(max(0.0, run.started + plan.duration - time.perf_counter()))
        finish("duration")

    if plan.warmup == 0:
        run.started, cpu_start = time.perf_counter(), time.process_time()
        measuring.set()
    tasks = [asyncio.create_task(worker(i)) for i in range(plan.concurrency)]
    if plan.duration:
        tasks.append(asyncio.create_task(timer()))
    tasks.append(asyncio.create_task(_lateness(measuring, run.loop_lags)))
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not run.started:  # the pages ran out during the warm-up
        run.started = run.ended
    return run
