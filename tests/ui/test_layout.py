"""The /ui page with a layout, in headless Chromium: each block's box drawn over the page image,
coloured by its label, beside the list of blocks (pointing at or clicking one marks the other),
the page's markdown rendered with its figure crops; hostile block text and labels (`<script>`,
`<img onerror>`) shown as text, nothing run, no CSP violation.

The gateway runs in front of a backend answering by prompt and a stand-in layout service with
chosen boxes (tests/paddlex/conftest.py): a real engine and layout model cannot be made to
write hostile text or labels on demand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver import ActionChains

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.paddlex.conftest import Answering, page_png, services
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import ThreadedServer
from tests.ui.browser import Browser

SHORT = 60.0
SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=1">'
BOXES = [
    box("doc_title", 40, 40, 400, 80, order=1),
    box("text", 40, 100, 560, 160, order=2),
    box(SCRIPT, 40, 170, 560, 190),  # a label no layout model has: kept as a block, read as text
    box("table", 40, 200, 560, 400),
    box("image", 320, 420, 560, 600),
]
TEXT = f"Plain words {SCRIPT} and {IMG} [x](javascript:window.__pwned=1)"


@contextlib.contextmanager
def layout_gateway(tmp_path: Path) -> Iterator[tuple[str, Answering, LayoutStandin]]:
    """The gateway (with /ui) in front of the backend and the stand-in layout service."""
    with services(BOXES) as (fake, layout):
        fake.answers["OCR:"] = TEXT
        fake.answers["Table Recognition:"] = f"<fcel>{SCRIPT}<fcel>{IMG}<nl><fcel>1<fcel>2<nl>"
        settings = settings_for(
            fake.url, layout_url=[layout.url], preprocess_workers=1, data_dir=tmp_path / "data"
        )
        with ThreadedServer(create_app(settings), lifespan="on") as server:
            yield server.url, fake, layout


def read_page(browser: Browser, url: str, tmp_path: Path) -> None:
    """The page PNG through /ui (layout auto: the service is there), until it is shown."""
    path = tmp_path / "page.png"
    path.write_bytes(page_png())
    browser.open(f"{url}/ui")
    browser.read(path, CLIENT_KEY)
    browser.wait(lambda: browser.state() == "done", SHORT)
    browser.wait(lambda: browser.script("return document.querySelector('.layout')?.dataset.placed"))


def rects(browser: Browser) -> tuple[float, list[list[float]]]:
    """One screen pixel in the image's own pixels, and each box's rectangle relative to the
    page image in the image's pixels."""
    scale, found = browser.script(
        "const img = document.querySelector('.layout img'); const r = img.getBoundingClientRect();"
        "const k = img.naturalWidth / r.width;"
        "return [k, [...document.querySelectorAll('.box')].map(b => { const q ="
        " b.getBoundingClientRect(); return [(q.left - r.left) * k, (q.top - r.top) * k,"
        " (q.right - r.left) * k, (q.bottom - r.top) * k]; })]"
    )
    return float(scale), found


def test_each_block_is_a_box_over_the_page_beside_its_text(
    browser: Browser, tmp_path: Path
) -> None:
    """One box per block, where its bbox says on the page image, coloured by label (the same
    label, the same colour); the list beside it in the same order with each block's label."""
    with layout_gateway(tmp_path) as (url, _, _):
        read_page(browser, url, tmp_path)
        labels = [item.find_element("css selector", ".label").text for item in browser.find_all(
            "li.block")]  # fmt: skip
        boxes = browser.find_all(".box")
        assert len(boxes) == len(labels) == len(BOXES)
        assert labels == [b["label"] for b in BOXES]
        pixel, found = rects(browser)
        for got, want in zip(found, BOXES, strict=True):  # within a screen pixel (snapping)
            for a, b in zip(got, want["coordinate"], strict=True):
                assert abs(a - b) <= pixel * 1.05, (got, want, pixel)
        colours = [b.get_attribute("class").split()[1] for b in boxes]
        items = [i.get_attribute("class").split()[1] for i in browser.find_all("li.block")]
        assert colours == items
        assert len(set(colours)) > 1
        browser.shot("layout")


def test_pointing_at_a_box_marks_its_block_and_a_click_picks_both(
    browser: Browser, tmp_path: Path
) -> None:
    """Hovering a box marks its block (and back); clicking a block picks its box."""
    with layout_gateway(tmp_path) as (url, _, _):
        read_page(browser, url, tmp_path)
        boxes, items = browser.find_all(".box"), browser.find_all("li.block")
        ActionChains(browser.driver).move_to_element(boxes[1]).perform()
        browser.wait(lambda: "hot" in items[1].get_attribute("class"))
        assert "hot" not in items[0].get_attribute("class")
        ActionChains(browser.driver).move_to_element(items[3]).perform()
        browser.wait(lambda: "hot" in boxes[3].get_attribute("class"))
        items[3].click()
        assert "picked" in boxes[3].get_attribute("class")
        boxes[0].click()
        assert "picked" in items[0].get_attribute("class")
        assert "picked" not in boxes[3].get_attribute("class")


def test_hostile_block_text_and_labels_run_nothing_and_show_as_text(
    browser: Browser, tmp_path: Path
) -> None:
    """`<script>` and `<img onerror>` in block texts, a table's cells and a label: all visible
    as text, no such element made, the window flag unset, no console error (no CSP report)."""
    with layout_gateway(tmp_path) as (url, _, _):
        read_page(browser, url, tmp_path)
        shown = browser.text("ol.blocks")
        assert SCRIPT in shown
        assert IMG in shown
        assert browser.script("return window.__pwned") is None
        made = browser.script(
            "return [...document.querySelectorAll('article script, article a, article iframe,"
            " article img')].map(n => n.localName + ':' + (n.className || '') + ':'"
            " + (n.getAttribute('src') || '').slice(0, 15))"
        )
        assert made
        for node in made:  # the page image, and figure crops from the gateway, only
            tag, cls, src = node.split(":", 2)
            assert tag == "img", node
            assert cls in ("", "figure"), node
            assert src.startswith("data:image/"), node
        assert browser.find_all(".box")[2].get_attribute("data-label") == SCRIPT
        assert browser.errors() == []
        browser.shot("layout-hostile")


def test_the_markdown_is_rendered_with_its_figures_and_downloads_as_is(
    browser: Browser, tmp_path: Path
) -> None:
    """The `rendered` tab draws the page's markdown: its title, its table as a table (cells as
    text), the image block as the gateway's crop; the download is the markdown."""
    with layout_gateway(tmp_path) as (url, fake, _):
        read_page(browser, url, tmp_path)
        browser.find(".tab-rendered").click()
        rendered = browser.find("article.page .rendered")
        title = rendered.find_element("css selector", "h2").text  # `__…__` is bold in markdown
        assert title.startswith("Plain words <script>window.")
        assert 'onerror="window.' in title
        cells = [td.text for td in rendered.find_elements("css selector", "td")]
        assert cells == [SCRIPT, IMG, "1", "2"]
        [figure] = rendered.find_elements("css selector", "img.figure")
        assert figure.get_attribute("src").startswith("data:image/jpeg;base64,")
        assert browser.script("return document.querySelector('img.figure').naturalWidth") == 240
        assert all(body.get("prettify_markdown") is None for body in fake.bodies)
        browser.find("#download-md").click()
        markdown = browser.downloaded("page.md")
    assert markdown.startswith("# Plain words")
    assert "![](imgs/img_in_image_box_320_420_560_600.jpg)" in markdown


@pytest.mark.parametrize("layout", ["off"])
def test_layout_off_shows_the_page_as_before(browser: Browser, tmp_path: Path, layout: str) -> None:
    """With layout off the card is the whole-page one: no boxes, no block list."""
    with layout_gateway(tmp_path) as (url, _, service):
        path = tmp_path / "page.png"
        path.write_bytes(page_png())
        browser.open(f"{url}/ui")
        browser.find("#layout").send_keys(layout)
        browser.read(path, CLIENT_KEY)
        browser.wait(lambda: browser.state() == "done", SHORT)
        assert browser.find_all(".box") == []
        assert browser.find_all("ol.blocks") == []
        assert service.seen == []


def test_the_orientation_and_unwarp_switches_reach_the_layout_service(
    browser: Browser, tmp_path: Path
) -> None:
    """Ticking **orientation** and **unwarp** sends `/v1/ocr`'s switches: the layout service is
    asked for both, and the page's boxes are drawn over the corrected page it sent back."""
    with layout_gateway(tmp_path) as (url, _, layout):
        browser.open(f"{url}/ui")
        browser.find("#orientation").click()
        browser.find("#unwarp").click()
        path = tmp_path / "page.png"
        path.write_bytes(page_png())
        browser.read(path, CLIENT_KEY)
        browser.wait(lambda: browser.state() == "done", SHORT)
        browser.wait(
            lambda: browser.script("return document.querySelector('.layout')?.dataset.placed")
        )
        assert layout.seen[-1].overrides["orientation"] is True
        assert layout.seen[-1].overrides["unwarp"] is True
        assert len(browser.find_all(".box")) == len(BOXES)
