"""Usage through the gateway in-process: /v1/usage, budgets on chat and /v1/ocr, the switch.

FakeVLLM stands in for the engine (its answers carry a fixed usage: 10 prompt, 2 completion
tokens), and PageFaults for a page that fails; the real engine's counts are in
tests/real/test_usage.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth import KeyFile, KeyLimits
from app.main import create_app
from tests.conftest import settings_for
from tests.documents.test_fanout import PageFaults
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.pages import chat_body, document_page
from tests.support.prometheus import metric
from tests.support.servers import lifespan_client, serving

pytestmark = pytest.mark.anyio
PAGE = document_page(seed=1)


def keys(folder: Path) -> tuple[Path, dict[str, str]]:
    """A keys file: `capped` with a budget of 2 pages a day, `free` with none."""
    path = folder / "keys.json"
    made = KeyFile(path)
    return path, {
        "capped": made.create("capped", KeyLimits(pages_per_day=2)),
        "free": made.create("free"),
    }


def bearer(key: str) -> dict[str, str]:
    """The OpenAI SDK's auth header."""
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
async def gateway(
    fake: FakeVLLM, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The gateway in-process in front of `fake`, its data dir in `tmp_path`, and the keys."""
    path, made = keys(tmp_path)
    settings = settings_for(fake.url, api_keys_file=path, data_dir=tmp_path, preprocess_workers=1)
    async with lifespan_client(create_app(settings), timeout=60) as client:
        yield client, made


def image_chat(fake: FakeVLLM, **extra: Any) -> dict[str, Any]:
    """A page as PaddleOCR's client sends it."""
    return chat_body(PAGE, model=fake.served, **extra)


async def test_usage_shows_the_callers_own_answered_requests(
    gateway: tuple[httpx.AsyncClient, dict[str, str]], fake: FakeVLLM
) -> None:
    """Two pages and a text chat by `free`: its usage says so, `capped` sees none of it."""
    client, made = gateway
    for body in (image_chat(fake), image_chat(fake), {**image_chat(fake), "messages": [
        {"role": "user", "content": "hello"}
    ]}):  # fmt: skip
        answer = await client.post("/v1/chat/completions", json=body, headers=bearer(made["free"]))
        assert answer.status_code == 200, answer.text
    mine = (await client.get("/v1/usage", headers=bearer(made["free"]))).json()
    assert mine["key"] == "free"
    assert mine["total"] == {
        "requests": 3, "pages": 2, "prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36,
        "cached_pages": 0,
    }  # fmt: skip
    assert [day["date"] for day in mine["data"]] == [mine["end"]]
    theirs = (await client.get("/v1/usage?key=free", headers=bearer(made["capped"]))).json()
    assert (theirs["key"], theirs["data"], theirs["total"]["requests"]) == ("capped", [], 0)
    scrape = (await client.get("/metrics")).text
    labels = {"key": "free", "model": fake.served}
    assert metric(scrape, "ocrvl_usage_pages_total", **labels) == 2
    assert metric(scrape, "ocrvl_usage_tokens_total", **labels, kind="prompt") == 30


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("start=2026-13-01", "start"),
        ("start=yesterday", "start"),
        ("end=2026-02-30", "end"),
        ("start=2026-12-02&end=2026-12-01", "start"),
        ("start=2020-01-01&end=2026-01-01", "end"),
    ],
)
async def test_bad_dates_are_a_400_naming_the_parameter(
    gateway: tuple[httpx.AsyncClient, dict[str, str]], query: str, param: str
) -> None:
    """A date that is no date, a reversed or too long range: 400 in OpenAI's shape."""
    client, made = gateway
    answer = await client.get(f"/v1/usage?{query}", headers=bearer(made["free"]))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


async def test_usage_needs_a_key(gateway: tuple[httpx.AsyncClient, dict[str, str]]) -> None:
    """No key: 401, nothing shown."""
    client, _ = gateway
    assert (await client.get("/v1/usage")).status_code == 401


async def test_the_page_past_the_budget_is_refused_before_the_engine(
    gateway: tuple[httpx.AsyncClient, dict[str, str]], fake: FakeVLLM
) -> None:
    """A budget of 2 pages a day: 2 pages served, the 3rd 429 insufficient_quota without
    reaching the engine; a text chat (no page) is still served."""
    client, made = gateway
    statuses = []
    for _ in range(3):
        answer = await client.post(
            "/v1/chat/completions", json=image_chat(fake), headers=bearer(made["capped"])
        )
        statuses.append(answer.status_code)
    assert statuses == [200, 200, 429]
    assert answer.json()["error"]["code"] == "insufficient_quota"
    assert "pages-per-day" in answer.json()["error"]["message"]
    assert int(answer.headers["retry-after"]) >= 1
    assert len(fake.bodies) == 2
    text = {"model": fake.served, "messages": [{"role": "user", "content": "hi"}]}
    answer = await client.post("/v1/chat/completions", json=text, headers=bearer(made["capped"]))
    assert answer.status_code == 200
    usage = (await client.get("/v1/usage", headers=bearer(made["capped"]))).json()
    assert usage["budgets"][0]["used"] == 2
    assert usage["budgets"][0]["limit"] == 2


async def test_a_document_over_the_budget_sends_no_page(
    gateway: tuple[httpx.AsyncClient, dict[str, str]], fake: FakeVLLM
) -> None:
    """A 3-page PDF against a budget of 2: 429 before any page reaches the engine."""
    client, made = gateway
    answer = await client.post(
        "/v1/ocr", files={"file": ("doc.pdf", pdf(3), "application/pdf")},
        headers=bearer(made["capped"]),
    )  # fmt: skip
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "insufficient_quota"
    assert fake.bodies == []


async def test_a_documents_failed_pages_are_given_back(tmp_path: Path) -> None:
    """A 2-page document whose 2nd page fails counts 1 page; the budget keeps room for 1 more."""
    path, made = keys(tmp_path)
    with serving(PageFaults({2})) as faults:
        settings = settings_for(
            faults.url, api_keys_file=path, data_dir=tmp_path, preprocess_workers=1,
            ocr_page_concurrency=1,
        )  # fmt: skip
        async with lifespan_client(create_app(settings), timeout=60) as client:
            answer = await client.post(
                "/v1/ocr", files={"file": ("doc.pdf", pdf(2), "application/pdf")},
                headers=bearer(made["capped"]),
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
            usage = (await client.get("/v1/usage", headers=bearer(made["capped"]))).json()
            assert (usage["total"]["requests"], usage["total"]["pages"]) == (1, 1)
            again = await client.post(
                "/v1/chat/completions", json=chat_body(PAGE, model=faults.served),
                headers=bearer(made["capped"]),
            )  # fmt: skip
            assert again.status_code == 200, again.text


async def test_a_stream_asks_the_engine_for_usage_unless_switched_off(
    fake: FakeVLLM, tmp_path: Path
) -> None:
    """A stream without stream_options goes to the engine asking for usage; OCRVL_USAGE=off
    sends it as it came, and has no /v1/usage."""
    path, made = keys(tmp_path)
    for usage, asked in (("on", {"include_usage": True}), ("off", None)):
        settings = settings_for(fake.url, api_keys_file=path, data_dir=tmp_path, usage=usage)
        async with lifespan_client(create_app(settings), timeout=60) as client:
            answer = await client.post(
                "/v1/chat/completions", json=image_chat(fake, stream=True),
                headers=bearer(made["free"]),
            )  # fmt: skip
            assert answer.status_code == 200
            assert fake.bodies[-1].get("stream_options") == asked
            shown = await client.get("/v1/usage", headers=bearer(made["free"]))
            assert shown.status_code == (200 if usage == "on" else 404)


async def test_a_streamed_document_counts_its_pages(
    gateway: tuple[httpx.AsyncClient, dict[str, str]], fake: FakeVLLM
) -> None:
    """/v1/ocr answered as NDJSON: one request, its two pages and their tokens counted."""
    client, made = gateway
    answer = await client.post(
        "/v1/ocr", files={"file": ("doc.pdf", pdf(2), "application/pdf")},
        headers={**bearer(made["free"]), "accept": "application/x-ndjson"},
    )  # fmt: skip
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    usage = (await client.get("/v1/usage", headers=bearer(made["free"]))).json()["total"]
    assert (usage["requests"], usage["pages"], usage["prompt_tokens"]) == (1, 2, 20)


async def job_usage(client: httpx.AsyncClient, key: str, pages: int) -> dict[str, Any]:
    """`key`'s usage total once its meter has flushed `pages` pages (within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        total: dict[str, Any] = (await client.get("/v1/usage", headers=bearer(key))).json()["total"]
        if total["pages"] >= pages or time.monotonic() > deadline:
            return total
        await asyncio.sleep(0.2)


async def test_a_jobs_pages_count_once_each_as_they_finish(
    gateway: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    """A 3-page job by `free`: its usage gains 3 pages and the engine's tokens of them, the
    same as the job's own `usage` says (no request: the job's pages are not chat requests)."""
    client, made = gateway
    files = {"file": ("doc.pdf", pdf(3))}
    created = await client.post("/v1/ocr/jobs", files=files, headers=bearer(made["free"]))
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    for _ in range(30):
        job = (
            await client.get(f"/v1/ocr/jobs/{job_id}?wait=5", headers=bearer(made["free"]))
        ).json()
        if job["status"] not in ("queued", "running"):
            break
    assert job["status"] == "succeeded", job
    total = await job_usage(client, made["free"], 3)
    assert total["pages"] == 3
    assert total["prompt_tokens"] == job["usage"]["prompt_tokens"]
    assert total["completion_tokens"] == job["usage"]["completion_tokens"]


async def test_a_job_past_the_budget_is_refused_before_it_is_stored(
    gateway: tuple[httpx.AsyncClient, dict[str, str]],
) -> None:
    """`capped` may read 2 pages a day: a 3-page job is a 429 insufficient_quota at once, and
    no job is kept for it."""
    client, made = gateway
    files = {"file": ("doc.pdf", pdf(3))}
    refused = await client.post("/v1/ocr/jobs", files=files, headers=bearer(made["capped"]))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert int(refused.headers["retry-after"]) >= 1
    listed = (await client.get("/v1/ocr/jobs", headers=bearer(made["capped"]))).json()
    assert listed["data"] == []
