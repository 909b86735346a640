"""`/layout-parsing` with document preprocessing answers what PaddleX's own server answers.

PaddleX's side is tests/paddlex/test_fidelity.py's (its serving app's `_infer` over its
PaddleOCR-VL-1.5 pipeline with fixed layout boxes), its DocPreprocessor's two models stubbed
(tests/paddlex/paddlex_serving.py `_stub_preprocessing`: the classifier finds the run's angle,
the unwarping gives the page back); the gateway's layout service is the stand-in keeping the
contract with the same angle and an identity unwarp (tests/support/layout_standin.py). The
pages are the fidelity corpus's, turned clockwise by the angle as a scanner would: both sides
turn them back (PaddleX with OpenCV's rotation, the service exactly), find their layout on the
upright page, and cut the blocks from it. Results must be equal field for field (images by
format and size) and both sides must have asked the model the same.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.fidelity import pages as corpus
from tests.paddlex.conftest import b64, gateway, run_paddlex
from tests.paddlex.test_fidelity import FIXED_LAYOUT, asked, images_as_sizes
from tests.support.layout_standin import LayoutStandin
from tests.support.servers import serving
from tests.support.standin_vlm import StandinVLM

# (angle, options): a turned page, orientation alone; an upright one, unwarping alone
RUNS: list[tuple[int, dict[str, Any]]] = [
    (90, {"useDocOrientationClassify": True, "useDocUnwarping": False}),
    (180, {"useDocOrientationClassify": True, "useDocUnwarping": False}),
    (270, {"useDocOrientationClassify": True, "useDocUnwarping": False, "visualize": False}),
    (0, {"useDocOrientationClassify": False, "useDocUnwarping": True, "visualize": False}),
]
DOCUMENTS = ("article", "figures")


def turned(path: Path, angle: int) -> bytes:
    """The page file turned clockwise by `angle`, as a PNG."""
    with Image.open(path) as page:
        image = page.convert("RGB").rotate(-angle, expand=True) if angle else page.convert("RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def sides(paddlex_python: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """For each run: (PaddleX's results, the gateway's, what each side asked its model)."""
    folder = tmp_path_factory.mktemp("corpus")
    documents = {doc.name: doc for doc in corpus.write(folder)}
    layouts = {p.size: p.boxes for doc in documents.values() for p in doc.pages}
    made = []
    for angle, options in RUNS:
        requests = [
            {"file": b64(turned(documents[name].path, angle)), "fileType": 1, **options}
            for name in DOCUMENTS
        ]
        with serving(StandinVLM()) as vlm:
            spec = {
                "mode": "infer", "server_url": f"{vlm.url}/v1", "layouts": layouts,
                "fixed_layout": str(FIXED_LAYOUT), "requests": requests,
                "preprocess": {"angle": angle},
            }  # fmt: skip
            expected = run_paddlex(spec, tmp_path_factory.mktemp("infer"))["answers"]
            paddlex_asked = list(vlm.received)

        async def read(angle: int = angle, requests: list[Any] = requests) -> Any:
            standin = LayoutStandin(
                boxes=lambda width, height, _: layouts[f"{width}x{height}"], angle=angle
            )
            with serving(StandinVLM()) as model, serving(standin) as layout:
                async with gateway(model, layout, request_timeout=300) as client:
                    got = []
                    for body in requests:
                        response = await client.post("/layout-parsing", json=body)
                        assert response.status_code == 200, response.text
                        got.append(response.json()["result"])
                return got, list(model.received)

        got, gateway_asked = asyncio.run(read())
        made.append((expected, got, paddlex_asked, gateway_asked))
    return made


def first_difference(mine: Any, theirs: Any, where: str = "") -> str | None:
    """Where two answers first differ, and how (None: equal)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        if set(mine) != set(theirs):
            return f"{where}: keys {sorted(set(mine) ^ set(theirs))}"
        for key in mine:
            if (found := first_difference(mine[key], theirs[key], f"{where}.{key}")) is not None:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if (found := first_difference(a, b, f"{where}[{i}]")) is not None:
                return found
        return None
    return None if mine == theirs else f"{where}: {mine!r:.300} != {theirs!r:.300}"


@pytest.mark.parametrize("run", range(len(RUNS)), ids=[f"{a}-{'-'.join(o)}" for a, o in RUNS])
def test_a_preprocessed_page_equals_paddlexs(sides: list[Any], run: int) -> None:
    """Every page's `prunedResult` (its `doc_preprocessor_res`, the corrected page's size, the
    blocks, the layout boxes), markdown and images equal PaddleX's; the same model requests."""
    expected, got, paddlex_asked, gateway_asked = sides[run]
    for mine, theirs in zip(got, expected, strict=True):
        assert first_difference(images_as_sizes(mine), images_as_sizes(theirs)) is None
    assert asked(gateway_asked) == asked(paddlex_asked)
