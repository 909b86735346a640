"""The metering code's own time per request, timed alone (no network, no other process).

On a shared machine the side-by-side gateways differ by about as much as two identical ones do
(the control); this times the exact calls metering adds to one request, on the same page body,
answer and stream, so the share of the gateway's CPU per request can be stated apart from noise.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import orjson

from app.auth import KeyLimits
from app.chat import parse
from app.context import RequestContext
from app.metrics import Metrics
from app.usage.base import Counts
from app.usage.meter import Meter
from app.usage.reading import StreamUsage, ask_for_usage, count_answer, pages_of, spliced
from app.usage.sqlite import SqliteUsage
from tests.support.fake_backend import STREAM_CHUNKS, completion

ROUNDS = 5000


async def _one(meter: Meter, body: bytes, stream: bool, chunks: list[bytes]) -> None:
    """What metering adds to one request: the route's admit, the relay's reading, the end."""
    chat = parse(body)
    context = RequestContext(key_name="bench", served_model="m")
    await meter.admit(context, pages_of(chat))
    ask = ask_for_usage(chat)
    raw = chat.take_body(chat.model, 10**9)  # the served name: no re-encoding
    if ask:
        spliced(raw)
    if stream:
        reader = StreamUsage(context, strip=ask is not None)
        for chunk in chunks:
            reader.feed(chunk)
        reader.rest()
    else:
        count_answer(context, chunks[0])
    context.answered = 1
    assert context.release is not None  # noqa: S101
    await context.release()


async def _timed(body: bytes, usage_event: bytes) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ocrvl-metering-path-") as folder:
        store = SqliteUsage(Path(folder))
        await store.open()
        meter = Meter(store, lambda _: KeyLimits(), Metrics())
        answer = [orjson.dumps(completion("m"))]
        events = [*STREAM_CHUNKS[:-1], usage_event + STREAM_CHUNKS[-1]]
        stream_body = orjson.dumps(orjson.loads(body) | {"stream": True})
        found = {}
        for name, payload, stream, chunks in (
            ("json", body, False, answer),
            ("stream", stream_body, True, events),
        ):
            found[name] = await _per_call(meter, payload, stream, chunks, parse_only=False)
            found[f"{name} (parse alone)"] = await _per_call(
                meter, payload, stream, chunks, parse_only=True
            )
        started = time.process_time()
        for _ in range(200):
            await store.add({("bench", "2026-12-01"): Counts(1, 1, 1200, 12)})
        found["flush (one batch)"] = (time.process_time() - started) / 200 * 1e6
        await store.close()
    return found


async def _per_call(
    meter: Meter, body: bytes, stream: bool, chunks: list[bytes], *, parse_only: bool
) -> float:
    """CPU µs per call (parsing the body is the baseline subtracted by the caller)."""
    started = time.process_time()
    for _ in range(ROUNDS):
        if parse_only:  # what every request does anyway: its body parsed, its context made
            chat = parse(body)
            chat.take_body(chat.model, 10**9)
            RequestContext(key_name="bench", served_model="m")
        else:
            await _one(meter, body, stream, chunks)
    return (time.process_time() - started) / ROUNDS * 1e6


def code_path(body: bytes, usage_event: bytes) -> dict[str, float]:
    """µs of CPU per request that metering adds, json and stream, and per flush."""
    timed = asyncio.run(_timed(body, usage_event))
    return {
        "json": timed["json"] - timed["json (parse alone)"],
        "stream": timed["stream"] - timed["stream (parse alone)"],
        "flush_per_batch": timed["flush (one batch)"],
    }
