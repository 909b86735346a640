"""The /ui page in headless Chromium against the gateway in front of the fault fake (FakeVLLM).

The fake answers what a real engine cannot be made to write on demand: hostile page text
(`<script>`, `<img onerror>`, `javascript:` links) and refusals (no healthy backend).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import FakeVLLM
from tests.support.pages import document_page
from tests.support.servers import ThreadedServer
from tests.ui.browser import Browser

SHORT = 30.0  # seconds: the fake answers at once
HOSTILE = "\n".join([
    "# A page that fights back",
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    "[click me](javascript:window.__pwned=1)",
    '<table><tr><td colspan="2" onclick="window.__pwned=1" style="color:red">A</td></tr>'
    '<tr><td>B<img src=x onerror="window.__pwned=1"></td>'
    '<td><a href="javascript:window.__pwned=1">C</a></td></tr></table>',
])  # fmt: skip
SHOWN_AS_TEXT = [
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    "[click me](javascript:window.__pwned=1)",
    '<img src=x onerror="window.__pwned=1">',
    '<a href="javascript:window.__pwned=1">C</a>',
]


@contextlib.contextmanager
def gateway_on(fake: FakeVLLM, data_dir: Path, **overrides: Any) -> Iterator[str]:
    """The gateway (with its /ui; its job store in `data_dir`) in front of `fake`; its URL."""
    settings = settings_for(fake.url, preprocess_workers=1, data_dir=data_dir, **overrides)
    with ThreadedServer(create_app(settings), lifespan="on") as server:
        yield server.url


@pytest.fixture
def gateway_url(fake: FakeVLLM, tmp_path: Path) -> Iterator[str]:
    """The gateway in front of the fake, default settings."""
    with gateway_on(fake, tmp_path / "data") as url:
        yield url


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    """`data` as the file `name` to pick in the page."""
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_hostile_page_text_runs_nothing_and_is_shown_as_text(
    browser: Browser, fake: FakeVLLM, gateway_url: str, tmp_path: Path
) -> None:
    """`<script>`, `<img onerror>`, `javascript:` links and a table with handlers: the window flag
    stays unset, no such element exists, every piece is visible as text, only rowspan/colspan
    survive, the CSP reported nothing (nothing even tried), and the markdown download is the
    model's text byte for byte."""
    fake.content = HOSTILE
    browser.open(f"{gateway_url}/ui")
    browser.read(write(tmp_path, "page.png", document_page(0)), CLIENT_KEY)
    browser.wait(lambda: browser.state() == "done", SHORT)
    rendered = browser.find("article.page .rendered")
    shown = rendered.text
    for piece in SHOWN_AS_TEXT:
        assert piece in shown
    assert rendered.find_elements("css selector", "script, img, a, iframe, object, embed") == []
    cells = browser.script(
        "return [...document.querySelectorAll('.rendered td')].map("
        "td => [...td.attributes].map(a => a.name + '=' + a.value).join(' '))"
    )
    assert cells == ["colspan=2", "", ""]
    browser.wait(lambda: browser.find("article.page figure img").get_attribute("complete"))
    assert browser.script("return window.__pwned") is None
    assert browser.errors() == []
    browser.shot("hostile-text")
    browser.find("#download-md").click()
    assert browser.downloaded("page.md") == HOSTILE + "\n"


def test_a_table_answer_is_a_table_whose_cells_hold_text(
    browser: Browser, fake: FakeVLLM, gateway_url: str, tmp_path: Path
) -> None:
    """task=table: the gateway's OTSL->HTML table is drawn as a table (spans kept), and a cell
    the model filled with `<script>` shows it as text; the JSON download has the page's html."""
    fake.content = (
        "<fcel>Name<fcel>Score<nl>"
        "<fcel><script>window.__pwned=1</script><fcel><img src=x onerror=window.__pwned=1><nl>"
        "<fcel>merged<lcel><nl>"
    )
    browser.open(f"{gateway_url}/ui")
    browser.read(write(tmp_path, "table.png", document_page(1)), CLIENT_KEY, task="table")
    browser.wait(lambda: browser.state() == "done", SHORT)
    rows = browser.script(
        "return [...document.querySelectorAll('.rendered tr')].map(tr => [...tr.children].map("
        "td => [td.textContent, td.colSpan]))"
    )
    assert rows == [
        [["Name", 1], ["Score", 1]],
        [["<script>window.__pwned=1</script>", 1], ["<img src=x onerror=window.__pwned=1>", 1]],
        [["merged", 2]],
    ]
    assert browser.script("return window.__pwned") is None
    browser.shot("table")
    browser.find("#download-json").click()
    document = json.loads(browser.downloaded("table.json"))
    assert document["pages"][0]["html"].startswith("<table><tr><td>Name</td>")
    assert document["pages"][0]["text"] == fake.content
    assert "image" not in document["pages"][0]


def test_a_wrong_key_shows_the_401_message(
    browser: Browser, gateway_url: str, tmp_path: Path
) -> None:
    """A key the gateway does not know: the page says so, with the gateway's own message."""
    browser.open(f"{gateway_url}/ui")
    browser.read(write(tmp_path, "doc.pdf", pdf(1)), "sk-not-a-key")
    browser.wait(lambda: browser.state() == "failed", SHORT)
    assert browser.text("#error-title") == "The API key was refused (401): check the key above."
    assert browser.text("#error-detail").startswith("The gateway said: ")
    assert "API key" in browser.text("#error-detail")
    assert browser.find_all("article.page") == []
    browser.shot("wrong-key")


def test_too_many_pages_shows_the_limit(browser: Browser, fake: FakeVLLM, tmp_path: Path) -> None:
    """A 3-page PDF against OCRVL_MAX_PAGES=2: "Too many pages" with the gateway's reason."""
    with gateway_on(fake, tmp_path / "data", max_pages=2) as url:
        browser.open(f"{url}/ui")
        browser.read(write(tmp_path, "doc.pdf", pdf(3)), CLIENT_KEY)
        browser.wait(lambda: browser.state() == "failed", SHORT)
    assert browser.text("#error-title") == "Too many pages (400): choose fewer in “Pages”."
    detail = browser.text("#error-detail")
    assert "code too_many_pages" in detail
    assert "param pages" in detail
    browser.shot("too-many-pages")


def test_no_healthy_backend_shows_503_with_its_retry_after(
    browser: Browser, fake: FakeVLLM, tmp_path: Path
) -> None:
    """Every backend down: the 503 in words with the Retry-After it came with (7 s here)."""
    fake.mode = "unhealthy"
    with gateway_on(fake, tmp_path / "data", health_interval=7) as url:
        browser.open(f"{url}/ui")
        browser.read(write(tmp_path, "doc.pdf", pdf(1)), CLIENT_KEY)
        browser.wait(lambda: browser.state() == "failed", SHORT)
    assert browser.text("#error-title") == (
        "The server is overloaded or has no engine up (503). "
        "Retry after 7 s (the server's Retry-After)."
    )
    assert "no healthy backend" in browser.text("#error-detail")
    browser.shot("overloaded")


def test_a_job_shows_its_progress_and_its_pages_as_they_are_kept(
    browser: Browser, fake: FakeVLLM, tmp_path: Path
) -> None:
    """ "as a job": POST /v1/ocr/jobs, a progress bar that climbs page by page to 4/4, the four
    pages drawn as the job keeps them, and the markdown download of the whole job."""
    fake.delay = 1.0  # a second a page, one page at a time: the bar has steps to show
    with gateway_on(fake, tmp_path / "data", job_page_concurrency=1) as url:
        browser.open(f"{url}/ui")
        browser.find("#as-job").click()
        browser.read(write(tmp_path, "long.pdf", pdf(4)), CLIENT_KEY)
        seen: list[str] = []

        def watch() -> bool:
            # the state before the bar: the page sets the bar before it says done, so the bar
            # read after "done" is the last one (read the other way round, a poll could see 3/4,
            # then the page reach 4/4 and done before the state was read)
            ended = browser.state() in ("done", "failed")
            value = browser.script("return document.body.dataset.progress")
            if value and value not in seen:
                seen.append(value)
                if value == "2/4":
                    browser.shot("job-progress")
            return ended

        browser.wait(watch, SHORT)
    assert browser.state() == "done", browser.text("#status")
    assert seen[-1] == "4/4"
    assert any(value in seen for value in ("1/4", "2/4", "3/4"))
    done = [int(value.split("/")[0]) for value in seen]
    assert done == sorted(done)
    assert [a.get_attribute("data-index") for a in browser.find_all("article.page")] == [
        "1", "2", "3", "4",
    ]  # fmt: skip
    assert "job job_" in browser.text("#message") or "4 pages in" in browser.text("#message")
    assert browser.text("article.page .placeholder") == "no page image: a job keeps only the text"
    browser.find("#download-md").click()
    assert browser.downloaded("long.md") == "\n\n".join(["Hello page"] * 4) + "\n"


def test_stop_closes_the_stream_and_the_gateway_stops_the_pages(
    browser: Browser, fake: FakeVLLM, gateway_url: str, tmp_path: Path
) -> None:
    """Stop mid-document: the page says so and the gateway drops the page upstream (the fake
    sees the gateway hang up), as for any client that goes away."""
    fake.mode = "hang"
    browser.open(f"{gateway_url}/ui")
    browser.read(write(tmp_path, "doc.pdf", pdf(1)), CLIENT_KEY)
    assert fake.chat_started.wait(SHORT)
    browser.find("#stop").click()
    browser.wait(lambda: browser.state() == "stopped", SHORT)
    assert browser.text("#message") == "Stopped: 0 of 1 pages read."
    assert fake.disconnected.wait(SHORT)


def test_stop_cancels_a_job(browser: Browser, fake: FakeVLLM, tmp_path: Path) -> None:
    """Stop on a job: DELETE /v1/ocr/jobs/{id}; the job is cancelled, its page in flight too."""
    fake.mode = "hang"
    with gateway_on(fake, tmp_path / "data", job_page_concurrency=1) as url:
        browser.open(f"{url}/ui")
        browser.find("#as-job").click()
        browser.read(write(tmp_path, "long.pdf", pdf(3)), CLIENT_KEY)
        assert fake.chat_started.wait(SHORT)
        browser.wait(lambda: "job job_" in browser.text("#message"), SHORT)
        job_id = browser.text("#message").split("(job ")[1].split(",")[0]
        browser.find("#stop").click()
        browser.wait(lambda: browser.state() == "stopped", SHORT)
        assert fake.disconnected.wait(SHORT)
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        job = httpx.get(f"{url}/v1/ocr/jobs/{job_id}", headers=headers, timeout=10)
    assert job.status_code == 200, job.text
    assert job.json()["status"] == "cancelled"


def test_the_key_stays_in_the_tab_only(browser: Browser, gateway_url: str) -> None:
    """The key typed is in sessionStorage, never in localStorage or a cookie; Forget clears it."""
    browser.open(f"{gateway_url}/ui")
    browser.find("#key").send_keys("sk-typed")
    browser.find("#task").click()  # leaving the box: its change event stores it
    stored = browser.script(
        "return [sessionStorage.getItem('ocrvl.apiKey'), localStorage.length, document.cookie]"
    )
    assert stored == ["sk-typed", 0, ""]
    browser.open(f"{gateway_url}/ui")  # a reload keeps it for the tab
    assert browser.find("#key").get_attribute("value") == "sk-typed"
    browser.find("#forget").click()
    assert browser.script("return sessionStorage.getItem('ocrvl.apiKey')") is None
