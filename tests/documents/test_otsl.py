"""OTSL → HTML on hand-written samples (the tiny model's output is random)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from app.documents.otsl import is_otsl, to_html


@pytest.mark.parametrize(
    ("otsl", "html"),
    [
        pytest.param(
            "<fcel>Name<fcel>Age<nl><fcel>Ann<fcel>31<nl>",
            "<table><tr><td>Name</td><td>Age</td></tr><tr><td>Ann</td><td>31</td></tr></table>",
            id="plain-2x2",
        ),
        pytest.param(
            "<fcel>Total<lcel><lcel><nl><fcel>1<fcel>2<fcel>3<nl>",
            '<table><tr><td colspan="3">Total</td></tr>'
            "<tr><td>1</td><td>2</td><td>3</td></tr></table>",
            id="colspan-from-lcel",
        ),
        pytest.param(
            "<fcel>Q1<fcel>a<nl><ucel><fcel>b<nl><ucel><fcel>c<nl>",
            '<table><tr><td rowspan="3">Q1</td><td>a</td></tr>'
            "<tr><td>b</td></tr><tr><td>c</td></tr></table>",
            id="rowspan-from-ucel",
        ),
        pytest.param(
            "<fcel>H<lcel><fcel>x<nl><ucel><xcel><fcel>y<nl><fcel>1<fcel>2<fcel>3<nl>",
            '<table><tr><td rowspan="2" colspan="2">H</td><td>x</td></tr>'
            "<tr><td>y</td></tr><tr><td>1</td><td>2</td><td>3</td></tr></table>",
            id="block-from-xcel",
        ),
        pytest.param(
            "<fcel>a<ecel><fcel>c<nl><ecel><fcel>e<ecel><nl>",
            "<table><tr><td>a</td><td></td><td>c</td></tr>"
            "<tr><td></td><td>e</td><td></td></tr></table>",
            id="empty-cells",
        ),
        pytest.param(
            "<fcel>a<fcel>b<fcel>c<nl><fcel>d<nl><fcel>g<fcel>h<fcel>i<nl>",
            "<table><tr><td>a</td><td>b</td><td>c</td></tr>"
            "<tr><td>d</td><td></td><td></td></tr>"
            "<tr><td>g</td><td>h</td><td>i</td></tr></table>",
            id="ragged-row-padded",
        ),
        pytest.param(
            "<fcel>a<fcel>b<nl><fcel>c<fcel>d<ecel><ecel><ecel><nl><fcel>e<fcel>f<nl>",
            "<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr>"
            "<tr><td>e</td><td>f</td></tr></table>",
            id="overlong-row-cut-to-the-cheapest-width",
        ),
        pytest.param(
            "<fcel>x < y & z<fcel><b>bold</b><nl>",
            "<table><tr><td>x &lt; y &amp; z</td><td>&lt;b&gt;bold&lt;/b&gt;</td></tr></table>",
            id="text-escaped",
        ),
        pytest.param(
            "<fcel>no final newline<fcel>ok",
            "<table><tr><td>no final newline</td><td>ok</td></tr></table>",
            id="missing-final-nl",
        ),
    ],
)
def test_otsl_becomes_the_html_paddleocr_shows(otsl: str, html: str) -> None:
    """Spans, empty cells, ragged rows and escaping follow PaddleX's convert_otsl_to_html."""
    assert to_html(otsl) == html


def test_a_row_never_narrower_than_its_last_filled_cell() -> None:
    """Evening rows keeps every filled cell, even when most rows are shorter."""
    html = to_html("<fcel>a<nl><fcel>b<nl><fcel>c<fcel>d<fcel>e<nl>")
    assert html is not None
    assert "<td>e</td>" in html
    assert html.count("<tr>") == 3


@pytest.mark.parametrize("text", ["plain words", "", "$$x^2$$"])
def test_text_without_cells_is_not_a_table(text: str) -> None:
    """Answers without OTSL cell tags give no HTML (the text is returned as it is)."""
    assert not is_otsl(text)
    assert to_html(text) is None


REFERENCE = """
import json, random, sys
from paddlex.inference.pipelines.paddleocr_vl.uilts import convert_otsl_to_html
random.seed(int(sys.argv[1]))
tags = ["<fcel>", "<ecel>", "<lcel>", "<ucel>", "<xcel>", "<nl>", "<fcel>", "<fcel>", "<nl>"]
cases = []
for _ in range(2000):
    otsl = ""
    for _ in range(random.randint(1, 30)):
        tag = random.choice(tags)
        otsl += tag + (random.choice(["a", "b c", "1", "x<y", " z "]) if tag == "<fcel>" else "")
    cases.append([otsl, convert_otsl_to_html(otsl)])
print(json.dumps(cases))
"""


def test_matches_paddlex_on_random_tables(paddlex_python: Path) -> None:
    """2,000 random OTSL strings (spans, ragged rows, stray merges) convert exactly as PaddleX's
    own `convert_otsl_to_html` does, run in the PaddleOCR client venv (a serial test: its
    fixture is the venv `make test` builds beside the in-process tier)."""
    done = subprocess.run(
        [str(paddlex_python), "-c", REFERENCE, "7"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cases = json.loads(done.stdout)
    mismatches = [(otsl, ref) for otsl, ref in cases if (to_html(otsl) or "") != ref]
    assert not mismatches, mismatches[:3]
