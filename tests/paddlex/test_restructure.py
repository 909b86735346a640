"""`/restructure-pages` answers what PaddleX's own serving code answers for the same pages.

PaddleX's side is its code, run in `.venv-paddleocr` (tests/paddlex/paddlex_serving.py: the
serving app's `_restructure_pages` with the pipeline's `restructure_pages`, BeautifulSoup's
table merging, scikit-learn's clustering of title heights); the gateway's side is the route,
in-process. The answers must be equal, field for field and character for character; the
pieces PaddleX leans on third-party code for (BeautifulSoup's re-serialised HTML, KMeans) are
compared on their own over many inputs.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from app.paddlex import tables, titles
from tests.paddlex import documents
from tests.paddlex.conftest import Answering, gateway, run_paddlex
from tests.support.servers import serving

pytestmark = pytest.mark.anyio
IMAGES = {"imgs/img_in_image_box_100_660_500_900.jpg": "aW1hZ2U=", "imgs/x.jpg": "eA=="}
SOUPS = [
    '<table><tr><td>a</td><td colspan="2">b &amp; c</td></tr></table>',
    "<table border=1><thead><tr><th>h</th></tr></thead><tbody><tr><td>1<br>2</td></tr></tbody>"
    "</table>",
    '<table><tr><td><img src="imgs/x.jpg" alt="Image"" />\n\ncap\n\n</td></tr></table>',
    "<table><tr><td>&quot;q&quot; &#150; &#x41; &#65x &foo; &lt;b&gt;</td></tr>  \n <tr>"
    '<td class="a   b">x</td></tr></table>',
    "<table><tr><td>open<td>two</tr></table></div>",
    "<html><body><table><tr><td>a</td></tr></table></body></html>",
    '<table><tr><td title=\'say "hi"\'>x</td><td title="it\'s">y</td></tr><!-- n --></table>',
    "<table><tr><td><script>a<b</script></td></tr></table>",
    '<table><tr><td rowspan="2" colspan="3" class="z" id="a">x</td></tr></table>',
    '<table><tr><td a>x</td><td b="">y</td></tr></table><p>a</p><p>b</div>',
    "<table><tr><td>\u3000 full\uff21</td></tr></tbody></tr><tr><td>y</td></tr></table>",
    "<table><tr><td>&#0;&#x110000;&#xD800;&#153;&amp &#12ab; &#xZZ;</td></tr></table>",
]


def requests() -> list[dict[str, Any]]:
    """The bodies both sides answer: every option, on pages drawn to exercise each rule."""
    book, spans = documents.book(), documents.spans()
    with_images = [{"prunedResult": p, "markdownImages": IMAGES} for p in book]
    formatted = [documents.page(
        [("paragraph_title", [10, 10, 500, 40], "2.1 Formatted"), ("table", [10, 50, 900, 400],
         documents.table(("a", "1"))), ("header", [10, 0, 900, 8], "kept raw"),
         ("chart", [10, 420, 400, 700], "x | y\n1 | 2")],
        format_block_content=True, markdown_ignore_labels=["header"], use_chart_recognition=True,
    )]  # fmt: skip
    whole = [documents.page(
        [("seal", [0, 0, 1000, 1400], "Seal Co.")], use_layout_detection=False,
    )]  # fmt: skip
    pages = [{"prunedResult": p} for p in book]
    return [
        {"pages": pages},
        {"pages": with_images, "concatenatePages": True},
        {"pages": with_images, "concatenatePages": True, "returnMarkdownImages": False},
        {"pages": with_images, "mergeTables": False, "relevelTitles": False},
        {"pages": pages, "prettifyMarkdown": False, "showFormulaNumber": True},
        {"pages": [{"prunedResult": p} for p in spans]},
        {"pages": [{"prunedResult": p} for p in spans], "concatenatePages": True},
        {"pages": [{"prunedResult": p} for p in formatted]},
        {"pages": [{"prunedResult": p} for p in whole], "logId": "my-log"},
        {"pages": []},
    ]


@pytest.fixture(scope="module")
def paddlex_answers(paddlex_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """PaddleX's answer to each of `requests()`."""
    spec = {"mode": "restructure", "requests": requests()}
    return run_paddlex(spec, tmp_path_factory.mktemp("restructure"))["answers"]


async def test_restructured_pages_equal_paddlex(paddlex_answers: list[dict[str, Any]]) -> None:
    """Each request's `result` is PaddleX's: merged tables (HTML and global ids), re-levelled
    titles, concatenated pages, formatted contents, the markdown text and images."""
    with serving(Answering()) as fake:
        async with gateway(fake, None) as client:
            for body, expected in zip(requests(), paddlex_answers, strict=True):
                response = await client.post("/restructure-pages", json=body)
                assert response.status_code == 200, response.text
                answer = response.json()
                assert (answer["errorCode"], answer["errorMsg"]) == (0, "Success")
                assert answer["result"] == expected, sorted(body)
                assert body.get("logId", answer["logId"]) == answer["logId"]


def test_the_corpus_exercises_each_rule(paddlex_answers: list[dict[str, Any]]) -> None:
    """PaddleX merged the book's first table into one and left the third apart, levelled its
    titles by more than four heights, and merged the span tables: without this the equality
    above could hold on pages that exercise nothing."""
    pages = [
        r["prunedResult"]["parsing_res_list"] for r in paddlex_answers[0]["layoutParsingResults"]
    ]
    first, second, third = (next(b for b in p if b["block_label"] == "table") for p in pages)
    assert "pears" in first["block_content"]
    assert "figs" in first["block_content"]
    assert second["block_content"] == ""
    assert second["global_group_id"] == first["global_block_id"]
    assert third["global_group_id"] == third["global_block_id"]
    titles_shown = paddlex_answers[0]["layoutParsingResults"][2]["markdown"]["text"]
    assert "\n\n#### " in titles_shown or "\n\n### " in titles_shown
    heights = {b["block_bbox"][3] - b["block_bbox"][1] for p in pages for b in p
               if b["block_label"] == "paragraph_title"}  # fmt: skip
    assert len(heights) > 4
    merged = paddlex_answers[5]["layoutParsingResults"][0]["prunedResult"]["parsing_res_list"][0]
    assert merged["block_content"].count("<tr>") == 4


@pytest.fixture(scope="module")
def soups(paddlex_python: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """BeautifulSoup's `str(BeautifulSoup(html, "html.parser"))` of each of SOUPS."""
    html: list[str] = run_paddlex({"mode": "soup", "html": SOUPS}, tmp_path_factory.mktemp("s"))[
        "html"
    ]
    return html


@pytest.mark.parametrize("index", range(len(SOUPS)))
def test_tables_are_written_back_as_beautifulsoup_writes_them(soups: list[str], index: int) -> None:
    """The table parser reads and writes HTML as BeautifulSoup's html.parser does: void
    elements, sorted attributes, entities, whitespace, stray end tags, comments, scripts."""
    assert str(tables.Soup(SOUPS[index])) == soups[index]


def test_title_heights_cluster_as_scikit_learn_clusters_them(
    paddlex_python: Path, tmp_path: Path
) -> None:
    """KMeans(min(4, distinct), random_state=42) over title heights, repeated in plain
    Python: the same clusters as scikit-learn's on 400 random documents."""
    rng = random.Random(20261202)
    cases = []
    for _ in range(400):
        sizes = rng.sample(range(10, 60), rng.randint(1, 9))
        cases.append([rng.choice(sizes) for _ in range(rng.randint(1, 40))])
    expected = run_paddlex({"mode": "kmeans", "heights": cases}, tmp_path)["clusters"]
    got = [{str(k): v for k, v in titles.cluster_levels(c).items()} for c in cases]
    assert got == expected
    assert sum(len(set(c)) > 4 for c in cases) > 100  # most cases run k-means proper
