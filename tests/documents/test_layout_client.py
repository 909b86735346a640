"""`ocrvl ocr`'s writer with layout pages: the document's markdown by default, figures saved
beside a markdown file under the names the markdown uses, and nothing outside its folder."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from app.client import Writer

FIGURE = "imgs/img_in_image_box_1_2_30_40.jpg"


def jpeg_url() -> str:
    out = io.BytesIO()
    Image.new("RGB", (29, 38), (200, 30, 30)).save(out, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def layout_page(index: int, markdown: str, **more: object) -> dict[str, object]:
    return {"object": "ocr.page", "index": index, "text": markdown, "markdown": markdown, **more}


def test_markdown_is_the_pages_markdown_in_page_order(capsys: pytest.CaptureFixture[str]) -> None:
    """To stdout: each page's markdown, in page order, as pages arrive out of order."""
    with Writer(None, "md", "doc.pdf") as writer:
        writer.start({"object": "ocr.document", "pages": [1, 2]})
        writer.add(layout_page(2, "## Two", blocks=[]))
        writer.add(layout_page(1, "# One", blocks=[]))
        writer.finish({"object": "ocr.summary", "usage": {}})
    assert capsys.readouterr().out == "# One\n\n## Two\n"


def test_a_markdown_file_gets_its_figures_beside_it(tmp_path: Path) -> None:
    """With --out x.md the figures are written to imgs/ next to it; a name that is not a plain
    imgs/NAME.jpg is not written anywhere."""
    out = tmp_path / "result" / "doc.md"
    out.parent.mkdir()
    images = {FIGURE: jpeg_url(), "../evil.jpg": jpeg_url(), "imgs/../../x.jpg": jpeg_url()}
    markdown = f'<img src="{FIGURE}" alt="Image" width="4%" />'
    with Writer(out, "md", "doc.pdf") as writer:
        writer.start({"object": "ocr.document", "pages": [1]})
        writer.add(layout_page(1, markdown, images=images))
        writer.finish({"object": "ocr.summary", "usage": {}})
    assert out.read_text() == markdown + "\n"
    with Image.open(out.parent / FIGURE) as saved:
        assert saved.size == (29, 38)
    written = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*.jpg"))
    assert written == [f"result/{FIGURE}"]


def test_json_keeps_the_blocks_and_images(tmp_path: Path) -> None:
    """--format json writes the pages as the server sent them, blocks and images included."""
    out = tmp_path / "doc.json"
    with Writer(out, "json", "doc.pdf") as writer:
        writer.start({"object": "ocr.document", "model": "m", "pages": [1]})
        writer.add(layout_page(1, "text", blocks=[{"label": "text"}], images={FIGURE: "x"}))
        writer.finish({"object": "ocr.summary", "usage": {"total_tokens": 3}})
    page = json.loads(out.read_text())["pages"][0]
    assert (page["blocks"], page["images"]) == ([{"label": "text"}], {FIGURE: "x"})
