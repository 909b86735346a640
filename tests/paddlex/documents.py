"""Pages as `/layout-parsing` answers them (`prunedResult`), drawn to exercise
`/restructure-pages`: tables that continue across pages (and ones that must not merge), titles
of every numbering style and many heights, formulas with numbers, figures, ignored labels."""

from __future__ import annotations

from typing import Any

SETTINGS = {
    "use_doc_preprocessor": False,
    "use_layout_detection": True,
    "use_chart_recognition": False,
    "use_seal_recognition": False,
    "use_ocr_for_image_block": False,
    "format_block_content": False,
    "merge_layout_blocks": True,
    "markdown_ignore_labels": [
        "number", "footnote", "header", "header_image", "footer", "footer_image", "aside_text",
    ],
    "return_layout_polygon_points": True,
}  # fmt: skip
HEAD = "<tr><td>Name</td><td>Qty</td></tr>"


def table(*rows: tuple[str, str], head: bool = True) -> str:
    """An HTML table as the pipeline writes one (OTSL → HTML), with its header row first."""
    body = "".join(f"<tr><td>{a}</td><td>{b}</td></tr>" for a, b in rows)
    return f"<table>{HEAD if head else ''}{body}</table>"


def page(blocks: list[tuple[str, list[int], str]], **settings: Any) -> dict[str, Any]:
    """A `prunedResult`: (label, bbox, content) blocks, ids, orders and groups as PaddleX
    numbers them, the layout boxes they came from."""
    chosen = {**SETTINGS, **settings}
    skip = {
        "figure_title", "vision_footnote", "image", "chart", "table", "header", "header_image",
        "footer", "footer_image", "footnote", "aside_text", *chosen["markdown_ignore_labels"],
    }  # fmt: skip
    made, order = [], 1
    for i, (label, bbox, content) in enumerate(blocks):
        made.append(
            {
                "block_label": label, "block_content": content, "block_bbox": bbox,
                "block_id": i, "block_order": None if label in skip else order, "group_id": i,
            }
        )  # fmt: skip
        order += label not in skip
    boxes = [
        {"cls_id": 22, "label": label, "score": 0.9, "coordinate": bbox, "order": None}
        for label, bbox, _ in blocks
    ]
    result: dict[str, Any] = {"page_count": None, "width": 1000, "height": 1400}
    result |= {"model_settings": chosen, "parsing_res_list": made}
    if chosen["use_layout_detection"]:
        result["layout_det_res"] = {"boxes": boxes}
    return result


def book() -> list[dict[str, Any]]:
    """Three pages: a table from page 1 continued on page 2 (its header repeated, a running
    header and a page number before it), one on page 3 that does not continue (text lies
    between), titles of five numbering styles at six heights, a numbered formula, figures."""
    one = page([
        ("doc_title", [100, 40, 900, 100], "# A Report"),
        ("paragraph_title", [100, 120, 600, 150], "1 Introduction"),
        ("text", [100, 160, 900, 300], "Some words\nacross lines."),
        ("paragraph_title", [100, 310, 600, 334], "1.1 Scope"),
        ("table", [100, 340, 900, 1300], table(("apples", "3"), ("pears", "4"))),
        ("footer", [100, 1350, 900, 1380], "page 1"),
    ])  # fmt: skip
    two = page([
        ("header", [100, 10, 900, 30], "A Report"),
        ("number", [880, 10, 900, 30], "2"),
        ("table", [100, 40, 905, 400], table(("plums", "5"), ("figs &amp; dates", "6"))),
        ("text", [100, 420, 900, 500], "After the table."),
        ("paragraph_title", [100, 510, 600, 540], "2 Methods"),
        ("paragraph_title", [100, 550, 600, 570], "(1) Step one"),
        ("display_formula", [100, 580, 600, 640], "$$ a+b $$"),
        ("formula_number", [800, 580, 900, 640], "(1)"),
        ("image", [100, 660, 500, 900], ""),
        ("figure_title", [100, 910, 500, 940], "Figure 1: a figure"),
        ("table", [100, 950, 900, 1300], table(("kiwis", "7"))),
        ("text", [100, 1310, 900, 1340], "Closing words."),
    ])  # fmt: skip
    three = page([
        ("header", [100, 10, 900, 30], "A Report"),
        ("table", [100, 40, 900, 300], table(("limes", "8"), head=False)),
        ("paragraph_title", [100, 320, 600, 354], "CONCLUSION"),
        ("paragraph_title", [100, 360, 600, 400], "IV. Results"),
        ("paragraph_title", [100, 410, 600, 428], "A. Appendix"),
        ("paragraph_title", [100, 430, 600, 452], "第二章 方法"),
        ("paragraph_title", [100, 460, 600, 488], "Plain title"),
        ("paragraph_title", [100, 490, 600, 512], "3.2.1 Deep"),
        ("seal", [600, 600, 800, 800], "Seal Co."),
        ("chart", [100, 820, 500, 1100], ""),
        ("aside_text", [920, 100, 990, 900], "aside"),
    ])  # fmt: skip
    return [one, two, three]


def spans() -> list[dict[str, Any]]:
    """Two pages whose tables have spans, entities and a figure: merged on their columns."""
    first = (
        '<table><tr><td rowspan="2">a</td><td colspan="2">b &lt;c&gt;</td></tr>'
        "<tr><td>d</td><td>e</td></tr></table>"
    )
    second = (
        '<table><tr><td>x</td><td><img src="imgs/img_in_image_box_1_2_3_4.jpg" alt="Image"" />'
        "</td><td>z</td></tr><tr><td>1</td><td>2</td><td>3 &amp; 4</td></tr></table>"
    )
    return [
        page([("table", [50, 50, 950, 900], first)]),
        page([("table", [60, 50, 950, 800], second), ("vision_footnote", [60, 810, 900, 840],
              "note")]),
    ]  # fmt: skip
