"""The results cache through the gateway (issue 51): a page read once is answered again without
a backend, per key, per options; it survives a restart (SQLite); jobs and the layout pipeline
use it page by page; usage and /metrics count it apart.

FakeVLLM and the layout stand-in count what reaches them; the cache's SQLite store is real.
"""

from __future__ import annotations

import base64
import contextlib
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from app.auth import KeyFile, KeyLimits
from app.main import create_app
from app.store.results import SqliteResults
from tests.conftest import CLIENT_KEY, settings_for
from tests.documents.test_layout_gateway import services
from tests.documents.test_layout_gateway import upload as page_upload
from tests.jobs.test_api import until_ended
from tests.support.documents import pages, pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.prometheus import metric
from tests.support.servers import lifespan_client, serving
from tests.test_budgets import until_used

pytestmark = pytest.mark.anyio
OTHER_KEY = "sk-test-other-client-key"
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


@contextlib.asynccontextmanager
async def gateway(
    fake: FakeVLLM, data_dir: Path, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process with the cache on, its store in `data_dir`, two client keys."""
    settings = settings_for(
        fake.url, api_keys=[CLIENT_KEY, OTHER_KEY], data_dir=data_dir, cache="on",
        preprocess_workers=1, **overrides,
    )  # fmt: skip
    async with lifespan_client(create_app(settings), headers=AUTH, timeout=60) as client:
        yield client


def upload(count: int = 2) -> dict[str, Any]:
    """A `count`-page PDF as the multipart `file`."""
    return {"file": ("doc.pdf", pdf(count), "application/pdf")}


def uncached(document: dict[str, Any]) -> dict[str, Any]:
    """The answer without its `cached` marks (what must equal the first answer)."""
    shown = [{k: v for k, v in page.items() if k != "cached"} for page in document["pages"]]
    return {**document, "pages": shown}


async def test_the_same_pages_again_reach_no_backend_and_come_back_equal_marked_cached(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Two pages read, then sent again: no second backend request, the same answer, every
    page `cached: true`, `x-ocrvl-cache` miss then hit; hits and misses in /metrics."""
    async with gateway(fake, tmp_path) as client:
        first = await client.post("/v1/ocr", files=upload())
        assert len(fake.bodies) == 2
        again = await client.post("/v1/ocr", files=upload())
        exposition = (await client.get("/metrics")).text
    assert (first.status_code, again.status_code) == (200, 200)
    assert len(fake.bodies) == 2
    assert (first.headers["x-ocrvl-cache"], again.headers["x-ocrvl-cache"]) == ("miss", "hit")
    assert [page.get("cached") for page in first.json()["pages"]] == [None, None]
    assert [page["cached"] for page in again.json()["pages"]] == [True, True]
    assert uncached(again.json()) == first.json()
    assert metric(exposition, "ocrvl_cache_hits_total") == 2
    assert metric(exposition, "ocrvl_cache_misses_total") == 2


async def test_another_key_reads_the_same_pages_again(fake: FakeVLLM, tmp_path: Path) -> None:
    """A hit never tells one key what another has read: the other key's request reaches the
    backend for every page, and is a miss."""
    async with gateway(fake, tmp_path) as client:
        await client.post("/v1/ocr", files=upload())
        other = await client.post(
            "/v1/ocr", files=upload(), headers={"authorization": f"Bearer {OTHER_KEY}"}
        )
    assert len(fake.bodies) == 4
    assert other.headers["x-ocrvl-cache"] == "miss"


@pytest.mark.parametrize(
    "options",
    [{"task": "table"}, {"max_tokens": "100"}, {"dpi": "200"}],
    ids=["task", "max_tokens", "dpi"],
)
async def test_other_options_read_the_pages_again(
    fake: FakeVLLM, tmp_path: Path, options: dict[str, str]
) -> None:
    """The same pages under another task, max_tokens or dpi reach the backend again."""
    async with gateway(fake, tmp_path) as client:
        await client.post("/v1/ocr", files=upload())
        other = await client.post("/v1/ocr", files=upload(), data=options)
    assert other.status_code == 200, other.text
    assert len(fake.bodies) == 4
    assert other.headers["x-ocrvl-cache"] == "miss"


@pytest.mark.parametrize(
    ("headers", "data"),
    [({"cache-control": "no-cache"}, {}), ({}, {"cache": "false"})],
    ids=["cache-control", "field"],
)
async def test_a_request_can_bypass_the_cache(
    fake: FakeVLLM, tmp_path: Path, headers: dict[str, str], data: dict[str, str]
) -> None:
    """`Cache-Control: no-cache`, or the `cache` field false: read again, `x-ocrvl-cache:
    bypass`, and nothing kept (a later plain request is a miss)."""
    async with gateway(fake, tmp_path) as client:
        bypassed = await client.post("/v1/ocr", files=upload(), headers=headers, data=data)
        plain = await client.post("/v1/ocr", files=upload())
        again = await client.post("/v1/ocr", files=upload(), headers=headers, data=data)
    assert bypassed.headers["x-ocrvl-cache"] == "bypass"
    assert plain.headers["x-ocrvl-cache"] == "miss"
    assert again.headers["x-ocrvl-cache"] == "bypass"
    assert len(fake.bodies) == 6


async def test_a_second_gateway_on_the_same_data_dir_answers_from_the_cache(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """A restart keeps the cache (SQLite): a new gateway on the data dir reaches no backend."""
    async with gateway(fake, tmp_path) as client:
        await client.post("/v1/ocr", files=upload())
    async with gateway(fake, tmp_path) as restarted:
        again = await restarted.post("/v1/ocr", files=upload())
    assert again.headers["x-ocrvl-cache"] == "hit"
    assert len(fake.bodies) == 2


async def test_another_served_model_never_gets_an_old_answer(tmp_path: Path) -> None:
    """The same pages in front of a backend serving another model are read again."""
    with serving(FakeVLLM()) as first, serving(FakeVLLM(served="another-model")) as second:
        async with gateway(first, tmp_path) as client:
            await client.post("/v1/ocr", files=upload())
        async with gateway(second, tmp_path) as client:
            other = await client.post("/v1/ocr", files=upload())
    assert other.headers["x-ocrvl-cache"] == "miss"
    assert (len(first.bodies), len(second.bodies)) == (2, 2)


async def test_a_page_repeated_in_one_document_is_read_once(fake: FakeVLLM, tmp_path: Path) -> None:
    """Pages 1 2 1 2 (read one at a time): the repeats are answered from the cache, by content;
    the answer says `partial`."""
    images = pages(2)
    doc = images[0].copy()
    out = io.BytesIO()
    doc.save(out, format="PDF", save_all=True, append_images=[images[1], images[0], images[1]])
    async with gateway(fake, tmp_path, ocr_page_concurrency=1) as client:
        answer = await client.post("/v1/ocr", files={"file": ("d.pdf", out.getvalue())})
    assert answer.headers["x-ocrvl-cache"] == "partial"
    assert [page.get("cached", False) for page in answer.json()["pages"]] == [
        False, False, True, True,
    ]  # fmt: skip
    assert len(fake.bodies) == 2


async def test_cached_pages_are_counted_apart_and_draw_nothing_from_the_budget(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """Budget 4 pages a day: 2 read, the same 2 again from the cache: the day reads 2 used,
    /v1/usage shows 2 pages and 2 cached pages, and a third 2-page document still fits."""
    keys = tmp_path / "keys.json"
    key = KeyFile(keys).create("team", KeyLimits(pages_per_day=4))
    headers = {"authorization": f"Bearer {key}"}
    settings = settings_for(
        fake.url, api_keys_file=keys, data_dir=tmp_path / "data", cache="on",
        preprocess_workers=1, usage_flush_interval=0.05,
    )  # fmt: skip
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        await client.post("/v1/ocr", files=upload())
        again = await client.post("/v1/ocr", files=upload())
        assert again.headers["x-ocrvl-cache"] == "hit"
        other = await client.post("/v1/ocr", files={"file": ("d.pdf", pdf(2, 300, 400))})
        assert other.status_code == 200, other.text
        usage = (await client.get("/v1/usage")).json()
    assert usage["budgets"][0]["used"] == 4
    assert usage["total"]["pages"] == 4
    assert usage["total"]["cached_pages"] == 2


async def test_a_job_sent_again_is_answered_from_the_cache_page_by_page(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """A 6-page job, then the same job: the second succeeds with every page `cached` and no
    backend request; its progress and result read as any job's (the 1,000-page path: the
    same run_pages, OCRVL_JOB_PAGE_CONCURRENCY at a time)."""
    async with gateway(fake, tmp_path, job_page_concurrency=2) as client:
        first = (await client.post("/v1/ocr/jobs", files=upload(6))).json()
        assert (await until_ended(client, first["id"]))["status"] == "succeeded"
        assert len(fake.bodies) == 6
        second = (await client.post("/v1/ocr/jobs", files=upload(6))).json()
        ended = await until_ended(client, second["id"])
        answer = await client.get(f"/v1/ocr/jobs/{second['id']}/result")
        earlier = (await client.get(f"/v1/ocr/jobs/{first['id']}/result")).json()
    result = answer.json()
    assert answer.headers["x-ocrvl-cache"] == "hit"
    assert (ended["status"], ended["pages_done"], ended["pages_failed"]) == ("succeeded", 6, 0)
    assert len(fake.bodies) == 6
    assert [page.get("cached") for page in earlier["pages"]] == [None] * 6
    assert [page["cached"] for page in result["pages"]] == [True] * 6
    assert [page["text"] for page in result["pages"]] == [p["text"] for p in earlier["pages"]]


async def test_a_laid_out_page_again_reaches_neither_the_layout_service_nor_the_engine(
    tmp_path: Path,
) -> None:
    """With the layout pipeline: the second request sends nothing to the layout stand-in nor
    to the backend, and answers the same markdown and blocks."""
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            first = await client.post("/v1/ocr", files=page_upload())
            sent, detected = len(fake.bodies), len(layout.seen)
            again = await client.post("/v1/ocr", files=page_upload())
    assert first.headers["x-ocr-layout"] == "on"
    assert (len(fake.bodies), len(layout.seen)) == (sent, detected) == (6, 1)
    assert again.headers["x-ocrvl-cache"] == "hit"
    assert uncached(again.json()) == first.json()


async def test_the_store_drops_expired_entries_then_the_oldest_over_its_cap(
    tmp_path: Path,
) -> None:
    """SQLite: an entry past the TTL is no hit and is swept; past the cap the oldest go."""
    store = SqliteResults(tmp_path, ttl=100, max_bytes=25)
    await store.open()
    try:
        now = time.time()
        await store.put("old", b"x" * 10, now - 200)
        await store.put("a", b"a" * 10, now - 2)
        await store.put("b", b"b" * 10, now - 1)
        await store.put("c", b"c" * 10, now)
        assert await store.get("old", now) is None
        size = await store.sweep(now)
        assert (size.entries, size.bytes) == (2, 20)
        assert [await store.get(k, now) for k in ("a", "b", "c")] == [None, b"b" * 10, b"c" * 10]
    finally:
        await store.close()


async def test_a_layout_parsing_request_again_is_a_hit(tmp_path: Path) -> None:
    """PaddleX's `/layout-parsing`: the same page again reaches no backend and no layout
    service, `x-ocrvl-cache: hit`, the same result."""
    body = {"file": base64.b64encode(page_upload()["file"][1]).decode(), "fileType": 1}
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            first = await client.post("/layout-parsing", json=body)
            sent = len(fake.bodies)
            again = await client.post("/layout-parsing", json=body)
    assert first.status_code == 200, first.text
    assert (first.headers["x-ocrvl-cache"], again.headers["x-ocrvl-cache"]) == ("miss", "hit")
    assert len(fake.bodies) == sent
    assert len(layout.seen) == 1
    strip = ("logId",)
    assert {k: v for k, v in again.json().items() if k not in strip} == {
        k: v for k, v in first.json().items() if k not in strip
    }


async def test_a_cached_job_gives_its_reserved_pages_back(fake: FakeVLLM, tmp_path: Path) -> None:
    """Budget 6 pages a day: a 3-page job, the same job again (every page cached), then another
    3-page job: all three accepted, the day reads 6 used (the cached job's 3 given back)."""
    keys = tmp_path / "keys.json"
    key = KeyFile(keys).create("team", KeyLimits(pages_per_day=6))
    settings = settings_for(
        fake.url, api_keys_file=keys, data_dir=tmp_path / "data", cache="on",
        preprocess_workers=1, usage_flush_interval=0.05,
    )  # fmt: skip
    headers = {"authorization": f"Bearer {key}"}
    document = {"file": ("doc.pdf", pdf(3), "application/pdf")}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        first = (await client.post("/v1/ocr/jobs", files=document)).json()
        await until_ended(client, first["id"])
        second = (await client.post("/v1/ocr/jobs", files=document)).json()
        assert (await until_ended(client, second["id"]))["status"] == "succeeded"
        assert await until_used(client, 3) == 3  # reserved 6, the cached 3 given back
        third = await client.post("/v1/ocr/jobs", files={"file": ("d.pdf", pdf(3, 300, 400))})
        assert third.status_code == 202, third.text
        await until_ended(client, third.json()["id"])
        usage = (await client.get("/v1/usage")).json()
    assert len(fake.bodies) == 6
    assert (usage["total"]["pages"], usage["total"]["cached_pages"]) == (6, 3)


async def test_a_stream_marks_its_cached_pages_and_counts_them_in_the_summary(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """NDJSON: each page line from the cache has `cached: true`, the summary `cached: 2`; no
    `x-ocrvl-cache` header (it goes out before any page is known)."""
    async with gateway(fake, tmp_path) as client:
        await client.post("/v1/ocr", files=upload())
        stream = await client.post("/v1/ocr", files=upload(), data={"stream": "true"})
    lines = [orjson.loads(line) for line in stream.text.splitlines()]
    assert [line.get("cached") for line in lines if line["object"] == "ocr.page"] == [True, True]
    assert lines[-1]["cached"] == 2
    assert "x-ocrvl-cache" not in stream.headers
    assert len(fake.bodies) == 2
