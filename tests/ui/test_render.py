"""The page's renderer (app/ui/render.js) run in headless Chromium on given model text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.main import create_app
from tests.conftest import settings_for
from tests.support.fake_backend import FakeVLLM
from tests.support.servers import ThreadedServer
from tests.ui.browser import Browser, browser_at

# The rendered DOM as nested [tag, attributes, children | text]: what the tests compare.
SHAPE = """
const shape = (node) => node.nodeType === Node.TEXT_NODE ? node.data : [
  node.localName,
  Object.fromEntries([...node.attributes].map((a) => [a.name, a.value])),
  [...node.childNodes].map(shape),
];
"""


@pytest.fixture(scope="module")
def page_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """/ui of a gateway in front of the fake (only the page's files are used)."""
    fake = FakeVLLM()
    data_dir = tmp_path_factory.mktemp("render-data")
    with ThreadedServer(fake) as backend:
        settings = settings_for(backend.url, preprocess_workers=1, data_dir=data_dir)
        with ThreadedServer(create_app(settings), lifespan="on") as server:
            yield f"{server.url}/ui"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One Chromium for the module: each test renders in the same loaded page."""
    yield from browser_at(tmp_path_factory.mktemp("render-browser"))


def rendered(browser: Browser, page_url: str, function: str, text: str) -> list[Any]:
    """render.js's `function` applied to `text`, as SHAPE gives it (top-level nodes)."""
    if browser.driver.current_url != page_url:
        browser.open(page_url)
    return list(
        browser.driver.execute_async_script(
            SHAPE
            + """
            const [fn, text, done] = arguments;
            import("/ui/render.js").then((render) => {
              document.querySelectorAll(".rendered-here").forEach((old) => old.remove());
              const box = document.body.appendChild(document.createElement("div"));
              box.className = "rendered-here";
              if (fn === "markdown") render.markdown(text, box);
              else box.append(render.sanitisedHtml(text));
              box.normalize(); // adjacent text nodes as one, as they read
              done([...box.childNodes].map(shape));
            });
            """,
            function,
            text,
        )
    )


def test_markdown_blocks_become_their_elements(browser: Browser, page_url: str) -> None:
    """Headings, paragraphs with their line breaks, lists, quotes, code, rules, LaTeX."""
    text = "\n".join([
        "# Title", "", "line one", "line **two** and *three*", "", "- a", "- b", "", "1. x",
        "", "> quoted", "", "```", "<b>raw</b>", "```", "---", "$$", "x^2", "$$",
        "inline `code` and $y$",
    ])  # fmt: skip
    assert rendered(browser, page_url, "markdown", text) == [
        ["h2", {}, ["Title"]],
        ["p", {}, ["line one", ["br", {}, []], "line ", ["strong", {}, ["two"]], " and ",
                   ["em", {}, ["three"]]]],
        ["ul", {}, [["li", {}, ["a"]], ["li", {}, ["b"]]]],
        ["ol", {}, [["li", {}, ["x"]]]],
        ["blockquote", {}, [["p", {}, ["quoted"]]]],
        ["pre", {"class": "code"}, [["code", {}, ["<b>raw</b>"]]]],
        ["hr", {}, []],
        ["pre", {"class": "latex"}, [["code", {}, ["$$\nx^2\n$$"]]]],
        ["p", {}, ["inline ", ["code", {}, ["code"]], " and ",
                   ["code", {"class": "latex"}, ["$y$"]]]],
    ]  # fmt: skip


def test_only_absolute_http_links_become_links(browser: Browser, page_url: str) -> None:
    """An https link is a link (noopener, new tab); javascript:, data:, relative links and
    every image stay the text the model wrote."""
    text = (
        "[ok](https://example.com/a) [js](javascript:alert(1)) [JS](JaVaScRiPt:alert(1)) "
        "[d](data:text/html,x) [rel](/v1/models) ![img](https://example.com/i.png)"
    )
    (paragraph,) = rendered(browser, page_url, "markdown", text)
    assert paragraph == [
        "p", {}, [
            ["a", {"href": "https://example.com/a", "rel": "noopener noreferrer nofollow",
                   "target": "_blank"}, ["ok"]],
            " [js](javascript:alert(1)) [JS](JaVaScRiPt:alert(1)) [d](data:text/html,x) "
            "[rel](/v1/models) ![img](https://example.com/i.png)",
        ],
    ]  # fmt: skip


def test_a_pipe_table_is_a_table(browser: Browser, page_url: str) -> None:
    """A markdown pipe table: a header row of th, body rows of td."""
    text = "| a | b |\n|---|:-:|\n| 1 | <i>2</i> |"
    assert rendered(browser, page_url, "markdown", text) == [
        ["table", {}, [
            ["thead", {}, [["tr", {}, [["th", {}, ["a"]], ["th", {}, ["b"]]]]]],
            ["tbody", {}, [["tr", {}, [["td", {}, ["1"]], ["td", {}, ["<i>2</i>"]]]]]],
        ]],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("html", "shape"),
    [
        (
            '<table><tr><td ROWSPAN="2" colspan=3 onclick="x()" style="a">a</td></tr></table>',
            [["table", {}, [["tr", {}, [["td", {"rowspan": "2", "colspan": "3"}, ["a"]]]]]]],
        ),
        (
            "<table><tr><td>&lt;script&gt;x&lt;/script&gt; &amp; &#60;b&#x3e;</td></tr></table>",
            [["table", {}, [["tr", {}, [["td", {}, ["<script>x</script> & <b>"]]]]]]],
        ),
        (
            '<td colspan="0" rowspan="-1">z</td>',
            [["td", {}, ["z"]]],
        ),
        (
            '<svg onload="x()"><table><tr><th>h</th></tr></table></svg><!-- c -->',
            ['<svg onload="x()">', ["table", {}, [["tr", {}, [["th", {}, ["h"]]]]]],
             "</svg><!-- c -->"],
        ),
        (
            '<table><tr><td><a href="javascript:x()">l</a><iframe src="/">',
            [["table", {}, [["tr", {}, [["td", {}, [
                '<a href="javascript:x()">l</a><iframe src="/">'
            ]]]]]]],
        ),
    ],
    ids=["spans-only", "entities-are-text", "bad-spans", "svg-and-comment", "unclosed"],
)  # fmt: skip
def test_the_table_allow_list(browser: Browser, page_url: str, html: str, shape: list[Any]) -> None:
    """Only table tags become elements, with only positive numeric spans; entities decode to
    text; every other tag, a comment and an unclosed tag are shown as written."""
    assert rendered(browser, page_url, "sanitisedHtml", html) == shape


def test_the_renderer_runs_nothing(browser: Browser, page_url: str) -> None:
    """After rendering every hostile form as markdown and as a table, the flag is unset and
    the CSP saw nothing try to run."""
    hostile = (
        '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'
        '<svg onload="window.__pwned=1"></svg>[a](javascript:window.__pwned=1)'
    )
    rendered(browser, page_url, "markdown", hostile)
    rendered(browser, page_url, "sanitisedHtml", f"<table><tr><td>{hostile}</td></tr></table>")
    assert browser.script("return window.__pwned") is None
    assert browser.errors() == []
