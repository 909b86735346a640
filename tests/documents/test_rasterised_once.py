"""A laid-out page is rasterised once (issue: a miss rasterised it three times): the results
cache's hash, the layout page and the crops are made from one rendering, on /v1/ocr, jobs and
/layout-parsing, with the cache on (miss or hit) or off; past OCRVL_PREPROCESS_HELD_BYTES a
page is rendered again for its crops, with the same answer.

The gateway's own worker processes count their rasterisings (tests/support/rasterising.py);
the layout service is the stand-in, the backend a FakeVLLM answering by prompt."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.documents.test_cache import gateway, uncached
from tests.documents.test_layout_gateway import services
from tests.jobs.test_api import until_ended
from tests.support.documents import pdf
from tests.support.rasterising import counting, logged, rasterisings

pytestmark = pytest.mark.anyio
PAGES = 2
ONCE = Counter({("page_image", i): 1 for i in range(PAGES)})  # each page, at full resolution


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Path]:
    """The rasterisings of the pools started in the test."""
    with counting(tmp_path / "rasterisings.log") as path:
        yield path


def upload() -> dict[str, Any]:
    return {"file": ("doc.pdf", pdf(PAGES), "application/pdf")}


def answer(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a laid-out page answers: its markdown and its blocks."""
    return [(page["markdown"], page["blocks"]) for page in document["pages"]]


async def test_a_laid_out_page_that_misses_the_cache_is_rasterised_once(
    tmp_path: Path, log: Path
) -> None:
    """A miss: one rendering per page (its hash, its layout page and its crops); the same
    pages again (hits): one per page, to hash it, as before; the answers equal."""
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            first = await client.post("/v1/ocr", files=upload())
            missed = rasterisings(log)
            again = await client.post("/v1/ocr", files=upload())
            hit = rasterisings(log)
    assert first.status_code == 200, first.text
    assert (first.headers["x-ocrvl-cache"], again.headers["x-ocrvl-cache"]) == ("miss", "hit")
    assert (missed, hit) == (ONCE, ONCE)
    assert len(layout.seen) == PAGES
    assert uncached(again.json()) == first.json()


async def test_after_a_hit_the_documents_next_page_keeps_no_pixels(
    tmp_path: Path, log: Path
) -> None:
    """A document sent again (one page at a time): its first page keeps its pixels for a miss
    that does not come, the pages after a hit keep none (a hit pays nothing more than its hash);
    the first reading kept every page's."""
    document = {"file": ("doc.pdf", pdf(3), "application/pdf")}
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url, ocr_page_concurrency=1) as client:
            await client.post("/v1/ocr", files=document)
            first = logged(log)
            again = await client.post("/v1/ocr", files=document)
            hits = logged(log)
    assert again.headers["x-ocrvl-cache"] == "hit"
    once = Counter({("page_image", i): 1 for i in range(3)})
    assert first == once + Counter({("kept", -1): 3})
    assert hits == once + Counter({("kept", -1): 1})


async def test_with_the_cache_off_a_laid_out_page_is_rasterised_once(
    tmp_path: Path, log: Path
) -> None:
    """`cache: false` (as OCRVL_CACHE=off): one rendering per page, for the layout page and
    the crops both (they were two)."""
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            read = await client.post("/v1/ocr", files=upload(), data={"cache": "false"})
    assert read.status_code == 200, read.text
    assert read.headers["x-ocrvl-cache"] == "bypass"
    assert rasterisings(log) == ONCE


async def test_past_the_held_bytes_a_page_is_rendered_again_for_its_crops_alike(
    tmp_path: Path, log: Path
) -> None:
    """OCRVL_PREPROCESS_HELD_BYTES=0: no pixels are held, each page is rendered for its layout
    page and again for its crops, and the answer is the one cut from the held pixels."""
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            held = await client.post("/v1/ocr", files=upload(), data={"cache": "false"})
        once = rasterisings(log)
        async with gateway(
            fake, tmp_path, layout_url=layout.url, preprocess_held_bytes=0
        ) as client:
            rendered = await client.post("/v1/ocr", files=upload(), data={"cache": "false"})
    assert (once, rasterisings(log)) == (ONCE, ONCE + ONCE)
    assert answer(rendered.json()) == answer(held.json())
    assert all(page["blocks"] for page in held.json()["pages"])


async def test_a_laid_out_job_page_is_rasterised_once(tmp_path: Path, log: Path) -> None:
    """A job's pages through the cache (a miss each): one rendering per page."""
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            job = (await client.post("/v1/ocr/jobs", files=upload())).json()
            ended = await until_ended(client, job["id"])
    assert (ended["status"], ended["pages_done"]) == ("succeeded", PAGES), ended
    assert rasterisings(log) == ONCE


async def test_a_layout_parsing_page_is_rasterised_once(tmp_path: Path, log: Path) -> None:
    """PaddleX's `/layout-parsing` (without `visualize`, which draws on the page again):
    one rendering per page."""
    body = {"file": base64.b64encode(pdf(PAGES)).decode(), "fileType": 0, "visualize": False}
    with services() as (fake, layout):
        async with gateway(fake, tmp_path, layout_url=layout.url) as client:
            parsed = await client.post("/layout-parsing", json=body)
    assert parsed.status_code == 200, parsed.text
    assert parsed.headers["x-ocrvl-cache"] == "miss"
    assert rasterisings(log) == ONCE
