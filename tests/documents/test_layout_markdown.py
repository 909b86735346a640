"""A page's blocks and markdown (app/documents/markdown.py, answers.py), as PaddleX assembles
them: titles, tables as HTML, formulas, figures as images, ignored labels, block order."""

from __future__ import annotations

from typing import Any

from app.documents import answers
from app.documents.crops import PagePlan, PlannedBlock
from app.documents.layout_options import LayoutOptions
from app.documents.markdown import BlockAnswer, assemble

OTSL = "<fcel>Year<fcel>Total<nl><fcel>2024<fcel>7<nl>"
TABLE = "<table><tr><td>Year</td><td>Total</td></tr><tr><td>2024</td><td>7</td></tr></table>"
STYLED = (
    "<table border=1 style='margin: auto; word-wrap: break-word;'><tr>"
    + "".join(
        f"<td style='text-align: center; word-wrap: break-word;'>{cell}</td>"
        for cell in ("Year", "Total")
    )
    + "</tr><tr>"
    + "".join(
        f"<td style='text-align: center; word-wrap: break-word;'>{cell}</td>"
        for cell in ("2024", "7")
    )
    + "</tr></table>"
)


def planned(label: str, bbox: list[int], *, sent: bool = True, **more: Any) -> PlannedBlock:
    block = PlannedBlock(label, bbox, 0.9, None, **more)
    if sent:
        block.prompt, block.url = "OCR:", "data:image/jpeg;base64,"
    return block


def page(*items: tuple[PlannedBlock, str | None], width: int = 1000, **options: Any) -> Any:
    """The assembled page of (block, answer) pairs (None: not sent)."""
    plan = PagePlan(width, 1400, [block for block, _ in items], {})
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    replies = [None if text is None else BlockAnswer(text, "stop", usage) for _, text in items]
    return assemble(plan, replies, LayoutOptions(**options))


def test_titles_text_and_the_ignored_labels() -> None:
    """doc_title is `#`, a numbered paragraph title one `#` per level past the first (at
    least `##`), text keeps paragraphs apart; header and footer (ignored by default) get an
    order of none and no markdown, but stay in the block list."""
    parsed = page(
        (planned("header", [0, 0, 900, 30]), "Journal of Tests"),
        (planned("doc_title", [0, 40, 900, 80]), "A Study\nof Things"),
        (planned("paragraph_title", [0, 90, 500, 110]), "2.1 Methods."),
        (planned("text", [0, 120, 900, 300]), "First line\nsecond line"),
        (planned("footer", [0, 1300, 900, 1330]), "Page 3"),
    )
    assert parsed.markdown == (
        "# A Study of Things\n\n### 2.1 Methods\n\nFirst line\n\nsecond line"
    )
    assert [(b["label"], b["order"]) for b in parsed.blocks] == [
        ("header", None), ("doc_title", 1), ("paragraph_title", 2), ("text", 3), ("footer", None),
    ]  # fmt: skip
    assert parsed.usage == {"prompt_tokens": 50, "completion_tokens": 15, "total_tokens": 65}
    custom = page((planned("header", [0, 0, 900, 30]), "Journal"), ignore_labels=())
    assert custom.markdown == "Journal"


def test_tables_are_html_and_pretty_markdown_centres_them() -> None:
    """A table's OTSL answer becomes HTML in its block (`text` and `html`); the markdown gets
    PaddleX's centred, bordered table after a newline; plain markdown the bare table."""
    parsed = page((planned("table", [0, 0, 500, 200]), OTSL))
    assert parsed.blocks[0]["text"] == parsed.blocks[0]["html"] == TABLE
    assert parsed.markdown == "\n" + STYLED
    assert page((planned("table", [0, 0, 500, 200]), OTSL), pretty=False).markdown == (
        "\n\n" + TABLE
    )
    raw = page((planned("table", [0, 0, 500, 200]), "no cells here"))
    assert raw.blocks[0]["text"] == "no cells here"
    assert "html" not in raw.blocks[0]


def test_formulas_keep_their_latex_and_math_delimiters_become_dollars() -> None:
    """`\\[…\\]` becomes ` $$ … $$ ` and `\\(…\\)` becomes ` $ … $` (dollar signs in such an
    answer removed first); a formula number loses its dollars; the block's `latex` is bare."""
    parsed = page(
        (planned("display_formula", [0, 0, 400, 60]), "\\[x^2+y^2=z^2\\]"),
        (planned("formula_number", [420, 0, 460, 60]), "\\((1)\\)"),
        (planned("text", [0, 80, 900, 120]), "where \\(x\\) costs $5"),
    )
    formula, number, text = parsed.blocks
    assert formula["text"] == " $$ x^2+y^2=z^2 $$ "
    assert formula["latex"] == "x^2+y^2=z^2"
    assert number["text"] == "  (1) "
    assert text["text"] == "where  $ x $ costs 5"
    assert parsed.markdown == " $$ x^2+y^2=z^2 $$ \n\nwhere  $ x $ costs 5"
    tagged = page(
        (planned("display_formula", [0, 0, 400, 60]), "$$E=mc^2$$"),
        (planned("formula_number", [420, 0, 460, 60]), "(2)"),
        formula_number=True,
    )
    assert tagged.markdown == "$$E=mc^2 \\tag*{(2)}$$"


def test_figures_are_images_by_path_scaled_to_the_page() -> None:
    """An image block is not sent; its markdown is a centred `<img>` at its share of the page
    width, named as PaddleX names it; plain markdown uses `![]()`."""
    path = "imgs/img_in_image_box_100_200_600_500.jpg"
    figure = planned("image", [100, 200, 600, 500], sent=False, image_path=path)
    caption = planned("figure_title", [100, 510, 600, 540])
    parsed = page((figure, None), (caption, "Figure 1: a\nchart"))
    assert parsed.markdown == (
        f'<div style="text-align: center;"><img src="{path}" alt="Image" width="50%" /></div>\n'
        '\n\n<div style="text-align: center;">Figure 1: a chart</div>\n'
    )
    assert parsed.blocks[0]["image"] == path
    assert parsed.blocks[0]["text"] == ""
    assert "finish_reason" not in parsed.blocks[0]
    plain = page((figure, None), (caption, "Figure 1"), pretty=False)
    assert plain.markdown == f"![]({path})\n\nFigure 1"


def test_a_table_shows_the_figure_it_contains() -> None:
    """A figure inside a table is no block of its own; the table's `[F<n>]` token becomes
    PaddleX's `<img>` tag (its doubled quote included), after the OTSL became HTML."""
    path = "imgs/img_in_image_box_10_10_50_50.jpg"
    figure = planned("image", [10, 10, 50, 50], sent=False, image_path=path, dropped=True)
    table = planned("table", [0, 0, 300, 300], token_map={"[F5]": path})
    parsed = page((figure, None), (table, "<fcel>[F5]<fcel>x<nl>"))
    assert [b["label"] for b in parsed.blocks] == ["table"]
    assert parsed.blocks[0]["text"] == (
        f'<table><tr><td><img src="{path}" alt="Image"" /></td><td>x</td></tr></table>'
    )


def test_a_looping_answer_is_cut_to_what_it_repeats() -> None:
    """truncate_repetitive_content: one line looping a phrase keeps what came before the loop
    (only past 50 characters for text; tables only past 5,000)."""
    loop = "intro text " + "ab cd ef gh " * 20
    assert answers.truncate_repetitive(loop, min_count=50) == "intro text"
    assert answers.content("text", loop) == "intro text"
    assert answers.content("table", loop) == loop
    lines = "\n".join(["same line"] * 12)
    assert answers.truncate_repetitive(lines, min_count=50) == "same line"


def test_a_cut_off_block_says_so_and_a_failed_one_carries_its_error() -> None:
    """A block that hit its token limit keeps finish_reason "length" (and makes the page's);
    a failed block carries its error and shows as a comment in the markdown."""
    plan = PagePlan(
        1000, 1400, [planned("text", [0, 0, 500, 50]), planned("text", [0, 60, 500, 90])], {}
    )
    error = {"message": "boom", "type": "server_error", "param": None, "code": "backend_error"}
    replies = [BlockAnswer("cut", "length", {}), BlockAnswer(error=error)]
    parsed = assemble(plan, replies, LayoutOptions())
    assert parsed.finish_reason == "length"
    assert parsed.blocks[0]["finish_reason"] == "length"
    assert parsed.blocks[1]["error"] == error
    assert (parsed.sent, parsed.failed) == (2, 1)
    assert parsed.markdown == "cut\n\n<!-- block 1 (text) failed: boom -->"
