"""Usage metering's parts on their own: reading `usage` off answers, the stores, the meter."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.auth import KeyLimits
from app.chat import parse
from app.context import RequestContext
from app.errors import BudgetExhausted
from app.metrics import Metrics
from app.store.sqlite import SqliteStore
from app.usage.base import Budget, Counts, DayTotals, Refusal, month_days, resets_at
from app.usage.meter import Meter
from app.usage.reading import StreamUsage, ask_for_usage, count_answer, pages_of, spliced
from app.usage.sqlite import SqliteUsage

pytestmark = pytest.mark.anyio

FIRST = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null}\n\n'
)
LAST = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"usage: 12"},"logprobs":null,'
    b'"finish_reason":"stop","stop_reason":null}]%s}\n\n'
)
USAGE_EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":321,"total_tokens":340,"completion_tokens":19}%s}\n\n'
)
DONE = b"data: [DONE]\n\n"
FINGERPRINT = b',"system_fingerprint":"fp_0.32.0-abc"'


def stream(with_usage: bool, fingerprint: bytes = FINGERPRINT) -> bytes:
    """A vLLM 0.32 chat stream's bytes, asked for usage or not: asked, the fingerprint moves
    from the finishing chunk to the usage chunk."""
    if with_usage:
        return FIRST + LAST % b"" + USAGE_EVENT % fingerprint + DONE
    return FIRST + LAST % fingerprint + DONE


def relayed(reader: StreamUsage, pieces: list[bytes]) -> bytes:
    """What the relay sends on for `pieces` arriving one by one."""
    return b"".join(reader.feed(piece) for piece in pieces) + reader.rest()


def cuts(data: bytes, at: int, step: int = 0) -> list[bytes]:
    """`data` cut at `at` (and every `step` bytes after, if given)."""
    if not step:
        return [data[:at], data[at:]]
    return [data[:at]] + [data[i : i + step] for i in range(at, len(data), step)]


def test_a_whole_answers_usage_is_read_from_its_end() -> None:
    """A non-streamed answer: its tokens are read and it counts as one answer."""
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": '"usage":{"prompt_tokens":1}'}}],
            "usage": {"prompt_tokens": 1500, "total_tokens": 1530, "completion_tokens": 30},
        }
    )
    context = RequestContext()
    count_answer(context, body)
    assert (context.answered, context.prompt_tokens, context.completion_tokens) == (1, 1500, 30)


def test_an_answer_without_usage_counts_no_tokens() -> None:
    """An answer that carries no `usage` still counts as answered, with no tokens."""
    context = RequestContext()
    count_answer(context, b'{"choices":[]}')
    assert (context.answered, context.prompt_tokens, context.completion_tokens) == (1, 0, 0)


@pytest.mark.parametrize("at", range(1, len(stream(True)), 7))
def test_a_stream_the_client_asked_usage_of_passes_unchanged(at: int) -> None:
    """include_usage asked by the client: every byte passes, wherever the network cut it,
    and the usage is read."""
    context = RequestContext()
    reader = StreamUsage(context, strip=False)
    assert relayed(reader, cuts(stream(True), at)) == stream(True)
    assert (context.prompt_tokens, context.completion_tokens) == (321, 19)


@pytest.mark.parametrize("fingerprint", [FINGERPRINT, b""])
@pytest.mark.parametrize("step", [1, 5, 64])
@pytest.mark.parametrize("at", range(1, len(stream(True)), 11))
def test_the_usage_event_the_gateway_asked_for_is_taken_out(
    at: int, step: int, fingerprint: bytes
) -> None:
    """include_usage asked by the gateway: the client gets exactly the stream vLLM sends when
    not asked (fingerprint back on the finishing chunk), however the bytes were cut, and the
    usage is read."""
    context = RequestContext()
    reader = StreamUsage(context, strip=True)
    sent = relayed(reader, cuts(stream(True, fingerprint), at, step))
    assert sent == stream(False, fingerprint)
    assert (context.prompt_tokens, context.completion_tokens) == (321, 19)


def test_continuous_usage_keeps_the_last_count() -> None:
    """Usage on every chunk (continuous stats asked by the client): the last one is the total."""
    chunk = (
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],'
        b'"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}}\n\n'
    )
    context = RequestContext()
    reader = StreamUsage(context, strip=False)
    pieces = [chunk % (5 + n, n) for n in (1, 2, 3)]
    assert relayed(reader, pieces) == b"".join(pieces)
    assert (context.prompt_tokens, context.completion_tokens) == (5, 3)


def chat(**fields: Any) -> Any:
    """A parsed chat request with `fields` added."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse(orjson.dumps(body))


def test_a_stream_without_stream_options_gets_them_spliced_in() -> None:
    """No `stream_options`: the client's bytes are kept, the usage request put in front."""
    request = chat(stream=True)
    raw = request.raw
    assert ask_for_usage(request) is True
    body = b"".join(spliced(request.for_backend("m", 10**9)))
    assert orjson.loads(body)["stream_options"] == {"include_usage": True}
    assert body.replace(b'"stream_options":{"include_usage":true},', b"") == raw


def test_stream_options_without_usage_are_edited() -> None:
    """`stream_options` without include_usage: include_usage on, continuous stats off."""
    request = chat(stream=True, stream_options={"continuous_usage_stats": True})
    assert ask_for_usage(request) is False
    sent = orjson.loads(request.for_backend("m", 10**9))
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}


@pytest.mark.parametrize(
    "fields", [{}, {"stream": True, "stream_options": {"include_usage": True}}]
)
def test_requests_that_need_no_change_are_left_alone(fields: dict[str, Any]) -> None:
    """Not a stream, or the client asked for usage itself: nothing is changed."""
    request = chat(**fields)
    assert ask_for_usage(request) is None
    assert request.edited is False


def test_a_chat_request_with_an_image_is_one_page() -> None:
    """An image part makes a page; text alone none."""
    image = [{"type": "image_url", "image_url": {"url": "https://x/p.png"}}]
    with_image = parse(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": image}]})
    )
    assert (pages_of(with_image), pages_of(chat())) == (1, 0)
    with_image.pages = 3  # the request policy's weight of `n: 3`
    assert pages_of(with_image) == 3  # n sequences of one page meter as n pages


@pytest.mark.parametrize(
    ("period", "day", "reset"),
    [
        ("day", "2026-12-31", "2027-01-01"),
        ("month", "2026-12-15", "2027-01-01"),
        ("month", "2027-02-28", "2027-03-01"),
        ("day", "2028-02-28", "2028-02-29"),
    ],
)
def test_budgets_reset_at_the_next_utc_day_or_month(period: str, day: str, reset: str) -> None:
    """A day's budget resets at the next UTC midnight, a month's on the 1st."""
    assert resets_at(period, day).isoformat() == f"{reset}T00:00:00+00:00"


def test_the_month_is_summed_from_its_first_day() -> None:
    """A month's budget counts every day from the 1st to today."""
    assert month_days("2026-12-03") == ["2026-12-01", "2026-12-02", "2026-12-03"]


async def test_the_usage_table_is_in_the_job_stores_file(tmp_path: Path) -> None:
    """One database per data dir: the usage table lives in the job store's file."""
    usage = SqliteUsage(tmp_path)
    assert SqliteStore(tmp_path).where == usage.where
    await usage.open()
    await usage.close()
    tables = sqlite3.connect(tmp_path / "jobs.sqlite3").execute("SELECT name FROM sqlite_master")
    assert ("usage_days",) in tables.fetchall()


async def test_sqlite_totals_add_up_across_two_connections(tmp_path: Path) -> None:
    """Two gateways on one data dir add into the same totals, per key and day."""
    first, second = SqliteUsage(tmp_path), SqliteUsage(tmp_path)
    await first.open()
    await second.open()
    try:
        await first.add({("a", "2026-12-01"): Counts(1, 2, 30, 4)})
        await second.add({("a", "2026-12-01"): Counts(1, 1, 10, 1), ("b", "2026-12-02"): Counts(1)})
        rows = await first.totals(None, "2026-12-01", "2026-12-31")
        assert [(r.key, r.day, r.counts.values()) for r in rows] == [
            ("a", "2026-12-01", (2, 3, 40, 5)),
            ("b", "2026-12-02", (1, 0, 0, 0)),
        ]
        assert [r.key for r in await second.totals("b", "2026-12-01", "2026-12-31")] == ["b"]
    finally:
        await first.close()
        await second.close()


async def test_sqlite_reservations_stop_at_the_budget(tmp_path: Path) -> None:
    """Pages are reserved up to the day's budget exactly, then refused; given back, they fit."""
    store = SqliteUsage(tmp_path)
    await store.open()
    try:
        budget = Budget(pages_per_day=5)
        assert await store.reserve("a", "2026-12-01", 3, budget) is None
        assert await store.reserve("a", "2026-12-01", 3, budget) == Refusal("day", 5, 3)
        assert await store.reserve("a", "2026-12-01", 2, budget) is None
        await store.unreserve("a", "2026-12-01", 2)
        assert await store.reserve("a", "2026-12-01", 2, budget) is None
        month = Budget(pages_per_month=7)
        assert await store.reserve("a", "2026-12-02", 3, month) == Refusal("month", 7, 5)
        assert await store.reserve("a", "2026-11-30", 3, month) is None  # another month
    finally:
        await store.close()


class FailingStore(SqliteUsage):
    """A usage store whose writes fail while `down` (an injected outage)."""

    down = True

    async def add(self, batch: dict[tuple[str, str], Counts]) -> None:
        if self.down:
            raise OSError("the disk is gone")
        await super().add(batch)


def meter_on(store: SqliteUsage, **limits: int) -> Meter:
    """A meter over `store`, every key with `limits`."""
    return Meter(store, lambda _: KeyLimits(**limits), Metrics())


def answered(key: str, prompt: int, completion: int) -> RequestContext:
    """A context as the relay leaves it after one answer."""
    context = RequestContext(key_name=key, served_model="m")
    context.answered, context.prompt_tokens, context.completion_tokens = 1, prompt, completion
    return context


async def test_counts_wait_in_memory_until_the_flush(tmp_path: Path) -> None:
    """Counted requests reach the store at the flush, not before; the read-out sees both."""
    store = SqliteUsage(tmp_path)
    await store.open()
    meter = meter_on(store)
    try:
        context = answered("a", 0, 0)
        await meter.admit(context, 1)
        context.prompt_tokens, context.completion_tokens = 100, 7
        assert context.release is not None
        await context.release()
        day = meter.today()
        assert await store.totals("a", day, day) == []
        assert [t.counts.values() for t in await meter.totals("a", day, day)] == [(1, 1, 100, 7)]
        await meter.flush()
        assert [t.counts.values() for t in await store.totals("a", day, day)] == [(1, 1, 100, 7)]
    finally:
        await store.close()


class HeldReads(SqliteUsage):
    """A usage store whose totals, once read, are held until `go` is set (a read in flight)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.read, self.go = asyncio.Event(), asyncio.Event()

    async def totals(self, key: str | None, start: str, end: str) -> list[DayTotals]:
        found = await super().totals(key, start, end)
        self.read.set()
        await self.go.wait()
        return found


async def test_a_flush_during_a_read_out_counts_each_request_once(tmp_path: Path) -> None:
    """GET /v1/usage while the flusher writes: the batch on its way to the store is counted
    once, never lost between the store's totals and the pending counts (CI once read a
    document's pages without its request)."""
    store = HeldReads(tmp_path)
    await store.open()
    meter = meter_on(store)
    try:
        meter.job_page("a", "m", {"prompt_tokens": 5, "completion_tokens": 2})
        day = meter.today()
        reading = asyncio.create_task(meter.totals("a", day, day))
        await store.read.wait()  # the store's totals are read: nothing flushed yet
        flushing = asyncio.create_task(meter.flush())
        await asyncio.sleep(0)  # the flush runs up to where it waits
        store.go.set()
        assert [t.counts.values() for t in await reading] == [(0, 1, 5, 2)]
        await flushing
        store.read.clear()
        assert [t.counts.values() for t in await meter.totals("a", day, day)] == [(0, 1, 5, 2)]
    finally:
        await store.close()


async def test_a_failed_flush_keeps_the_counts(tmp_path: Path) -> None:
    """A store outage loses nothing: the counts are written by the next flush that works."""
    store = FailingStore(tmp_path)
    await store.open()
    meter = meter_on(store)
    try:
        meter.job_page("a", "m", {"prompt_tokens": 5, "completion_tokens": 2})
        await meter.flush()
        meter.job_page("a", "m", {"prompt_tokens": 5, "completion_tokens": 2})
        store.down = False
        await meter.flush()
        day = meter.today()
        assert [t.counts.values() for t in await store.totals("a", day, day)] == [(0, 2, 10, 4)]
    finally:
        await store.close()


async def test_a_budget_refusal_names_the_budget_and_its_reset(tmp_path: Path) -> None:
    """Over the day's budget: 429 insufficient_quota, the budget and reset named, Retry-After
    until the reset and no retry by SDKs."""
    store = SqliteUsage(tmp_path)
    await store.open()
    meter = meter_on(store, pages_per_day=2)
    try:
        await meter.admit(RequestContext(key_name="a"), 2)
        with pytest.raises(BudgetExhausted) as refused:
            await meter.admit(RequestContext(key_name="a"), 1)
        error = refused.value
        assert (error.status, error.code, error.type) == (
            429,
            "insufficient_quota",
            "insufficient_quota",
        )
        assert "used 2 of its 2 pages per day (budget pages-per-day)" in error.message
        assert "resets at " + resets_at("day", meter.today()).strftime("%Y-%m-%dT") in error.message
        headers = error.headers()
        assert 1 <= int(headers["retry-after"]) <= 86_400
        assert headers["x-should-retry"] == "false"
    finally:
        await store.close()


async def test_pages_not_answered_are_given_back(tmp_path: Path) -> None:
    """A reservation of 3 pages with 1 answered keeps 1: the others fit the budget again."""
    store = SqliteUsage(tmp_path)
    await store.open()
    meter = meter_on(store, pages_per_day=3)
    try:
        context = answered("a", 10, 1)
        await meter.admit(context, 3)
        assert context.release is not None
        await context.release()
        await meter.flush()
        day = meter.today()
        assert [t.counts.values() for t in await store.totals("a", day, day)] == [(1, 1, 10, 1)]
        await meter.admit(RequestContext(key_name="a"), 2)  # fits: 1 + 2 of 3
    finally:
        await store.close()


async def test_a_job_reserves_its_pages_whole_and_gives_back_the_unanswered(
    tmp_path: Path,
) -> None:
    """A job's pages are reserved at once (a second job past the budget is refused, however
    little of the first has run); its answered pages count once (tokens with them), and its end
    gives back the pages that got no answer."""
    store = SqliteUsage(tmp_path)
    await store.open()
    meter = meter_on(store, pages_per_day=5)
    try:
        with pytest.raises(BudgetExhausted):
            await meter.reserve("a", 6)
        first = await meter.reserve("a", 4)
        assert first == {"day": meter.today(), "pages": 4}
        with pytest.raises(BudgetExhausted):
            await meter.reserve("a", 2)  # nothing of the first has run: its pages are taken
        for _ in range(2):
            meter.job_page("a", "m", {"prompt_tokens": 7, "completion_tokens": 3}, reserved=True)
        await meter.release("a", first, answered=2)  # cancelled after 2 pages
        await meter.flush()
        day = meter.today()
        assert [t.counts.values() for t in await store.totals("a", day, day)] == [(0, 2, 14, 6)]
        assert await meter.reserve("a", 3) is not None  # 2 used + 3 fit in 5
        assert await meter_on(store).reserve("a", 100) is None  # no budget: nothing reserved
    finally:
        await store.close()


async def test_a_store_that_cannot_open_yet_gets_the_counts_later(tmp_path: Path) -> None:
    """The store is unreachable at start (a file where the data dir should be): serving goes
    on, counts wait in memory, and the first flush after it is fixed writes them."""
    blocked = tmp_path / "data"
    blocked.write_text("not a folder")
    store = SqliteUsage(blocked)
    meter = meter_on(store)
    await meter.start()
    meter.job_page("a", "m", {"prompt_tokens": 1, "completion_tokens": 1})
    await meter.flush()
    blocked.unlink()
    await meter.flush()
    try:
        day = meter.today()
        assert [t.counts.values() for t in await store.totals("a", day, day)] == [(0, 1, 1, 1)]
    finally:
        await store.close()
