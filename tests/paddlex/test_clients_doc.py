"""docs/clients.md's PaddleX serving call, run as written (with `requests`, in
`.venv-paddleocr`) against a gateway on a loopback port: it prints each page's markdown; and
the same call with each option PaddleX's client may send (orientation, unwarping, OCR for image
blocks, spotting, vlmExtraArgs), each answer validated by PaddleX's own pydantic models."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.paddlex.conftest import b64, page_png, run_paddlex, services
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


# Each PaddleX option this server once refused, as PaddleX's client sends it; the stand-in
# layout service finds every page turned by 90 degrees (tests/support/layout_standin.py).
ANGLE = 90
OPTIONS: dict[str, dict[str, Any]] = {
    "orientation": {"useDocOrientationClassify": True},
    "unwarping": {"useDocUnwarping": True},
    "both": {"useDocOrientationClassify": True, "useDocUnwarping": True},
    "ocr-for-image-blocks": {"useOcrForImageBlock": True},
    "spotting": {"promptLabel": "spotting", "useLayoutDetection": False},
    "vlm-extra-args": {"vlmExtraArgs": {"top_p": 0.5, "ocr_max_pixels": 600_000}},
    "vlm-extra-args-empty": {"vlmExtraArgs": {}},
}


@pytest.fixture(scope="module")
def posted(paddlex_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """PaddleX's client call (tests/paddlex/paddlex_serving.py `post`) with each option, in one
    run of `.venv-paddleocr`, against a gateway on loopback: the answers, PaddleX's verdicts
    and what the backend and the layout stand-in were asked."""
    requests = [{"file": b64(page_png()), "fileType": 1, "visualize": False, **extra}
                for extra in OPTIONS.values()]  # fmt: skip
    with services(angle=ANGLE) as (fake, layout):
        settings = settings_for(fake.url, layout_url=[layout.url], preprocess_workers=1)
        with ThreadedServer(create_app(settings), lifespan="on") as server:
            spec = {"mode": "post", "url": server.url, "key": CLIENT_KEY, "requests": requests}
            report = run_paddlex(spec, tmp_path_factory.mktemp("post"))
        asked = [dict(body) for body in fake.bodies]
        seen = [dict(page.overrides) for page in layout.seen]
    return {"answers": dict(zip(OPTIONS, report["answers"], strict=True)), "asked": asked,
            "seen": seen}  # fmt: skip


@pytest.mark.parametrize("name", OPTIONS)
def test_paddlexs_client_gets_each_option_served_and_paddlex_validates_it(
    name: str, posted: dict[str, Any]
) -> None:
    """`requests.post` from PaddleX's venv with the option: 200 (not a 422 refusing it), the
    answer valid under PaddleX's `AIStudioResultResponse[InferResult]`, and its page saying
    the option ran."""
    got = posted["answers"][name]
    assert got["status"] == 200, got["answer"]
    assert got["valid"], got.get("error")
    page = got["answer"]["result"]["layoutParsingResults"][0]["prunedResult"]
    settings = page["model_settings"]
    options = OPTIONS[name]
    if "useDocOrientationClassify" in options or "useDocUnwarping" in options:
        steps = page["doc_preprocessor_res"]  # PaddleX's step defaults fill the one not sent
        asked = {"use_doc_orientation_classify": "useDocOrientationClassify" in options,
                 "use_doc_unwarping": "useDocUnwarping" in options}  # fmt: skip
        assert all(steps["model_settings"][key] for key, sent in asked.items() if sent)
        if asked["use_doc_orientation_classify"]:
            assert steps["angle"] == ANGLE
            assert any(overrides.get("orientation") for overrides in posted["seen"])
        if asked["use_doc_unwarping"]:
            assert any(overrides.get("unwarp") for overrides in posted["seen"])
    if name == "ocr-for-image-blocks":
        assert settings["use_ocr_for_image_block"] is True
    if name == "spotting":
        assert settings["use_layout_detection"] is False
        assert page["parsing_res_list"][0]["block_label"] == "spotting"
    if name == "vlm-extra-args":
        assert any(body.get("top_p") == 0.5 for body in posted["asked"])
