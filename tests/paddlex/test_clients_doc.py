"""docs/clients.md's PaddleX serving call, run as written (with `requests`, in
`.venv-paddleocr`) against a gateway on a loopback port: it prints each page's markdown."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.paddlex.conftest import services
from tests.support import paddlex_pipeline
from tests.support.documents import pdf
from tests.support.servers import ThreadedServer

DOC = Path(__file__).parents[2] / "docs" / "clients.md"


def snippet() -> str:
    """The Python block of the PaddleX serving section."""
    section = DOC.read_text().split("## PaddleX's serving API", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


def test_the_documented_call_reads_a_pdf(paddlex_python: Path, tmp_path: Path) -> None:
    """The snippet, its URL and key swapped for the test gateway's, prints the markdown of
    each page of a 2-page PDF."""
    (tmp_path / "doc.pdf").write_bytes(pdf(2))
    with services() as (fake, layout):
        settings = settings_for(fake.url, layout_url=[layout.url], preprocess_workers=1)
        with ThreadedServer(create_app(settings), lifespan="on") as server:
            code = snippet().replace("http://HOST:8000", server.url).replace("sk-...", CLIENT_KEY)
            done = subprocess.run(
                [str(paddlex_pipeline.python()), "-c", code],
                cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines().count("# Some words") == 2  # each page's title
