"""`/layout-parsing` answers what PaddleX's own server answers for the same request.

PaddleX's side is its serving app's `_infer` over its PaddleOCR-VL-1.5 pipeline
(tests/paddlex/paddlex_serving.py in `.venv-paddleocr`), its layout model replaced by fixed
boxes (tests/support/paddlex_fixed_layout.py); the gateway's side is the route in-process, its
layout service a stand-in answering the same boxes (tests/support/layout_standin.py). Each side
asks a StandinVLM of its own (tests/support/standin_vlm.py: the answer depends only on the
prompt and the pixels), over pages of the fidelity corpus (tests/fidelity/pages.py). The
`result`s must be equal field for field; images are compared by their format and size (the
encoders differ: PaddleX's OpenCV, the gateway's Pillow), and both sides must have asked the
model the same things, with the request's sampling fields and pixel bounds.
"""

from __future__ import annotations

import base64
import collections
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.fidelity import pages as corpus
from tests.fidelity.sketch import Page
from tests.paddlex.conftest import b64, gateway, run_paddlex
from tests.support.layout_standin import LayoutStandin
from tests.support.servers import serving
from tests.support.standin_vlm import Received, StandinVLM

pytestmark = pytest.mark.anyio
FIXED_LAYOUT = Path(__file__).parents[1] / "support" / "paddlex_fixed_layout.py"
EXTRA_ARGS = {
    "ocr_min_pixels": 150_000, "ocr_max_pixels": 700_000, "table_max_pixels": 500_000,
    "formula_min_pixels": 200_000, "temperature": 0.2, "max_new_tokens": 300,
}  # fmt: skip
# (document, extra fields): the corpus's kinds of file and pages, and PaddleX's options
RUNS: list[tuple[str, dict[str, Any]]] = [
    ("book-pdf", {}),
    ("book-pdf", {"restructurePages": True, "visualize": False}),
    ("book-tiff", {"layoutShapeMode": "rect", "markdownIgnoreLabels": ["header", "aside_text"]}),
    ("figures-sideways", {"useChartRecognition": True, "useSealRecognition": True}),
    (
        "formulas",
        {"prettifyMarkdown": False, "showFormulaNumber": True, "formatBlockContent": True},
    ),
    ("overlaps", {"returnMarkdownImages": False, "mergeLayoutBlocks": False}),
    ("merged_paragraphs", {"temperature": 0.3, "topP": 0.8, "repetitionPenalty": 1.1}),
    ("article", {"minPixels": 200_000, "maxPixels": 600_000, "maxNewTokens": 512}),
    ("blank", {}),  # a page on which the layout finds no block
    ("figures-sideways", {"useOcrForImageBlock": True, "prettifyMarkdown": False}),
    ("book-pdf", {"useOcrForImageBlock": True}),
    ("article", {"vlmExtraArgs": EXTRA_ARGS}),
]


def blank(folder: Path) -> corpus.Document:
    """A page on which both sides' layout finds no box (a size of its own, no boxes)."""
    image = Image.new("RGB", (700, 990), "white")
    path = folder / "blank.png"
    image.save(path, format="PNG")
    return corpus.Document("blank", path, [Page("blank", image, [])])


def bodies(documents: dict[str, corpus.Document]) -> list[dict[str, Any]]:
    """The request of each run, `fileType` given (PaddleX's server cannot tell base64 alone)."""
    made = []
    for name, extra in RUNS:
        path = documents[name].path
        kind = 0 if path.suffix == ".pdf" else 1
        made.append({"file": b64(path.read_bytes()), "fileType": kind, **extra})
    return made


def images_as_sizes(value: Any, key: str = "") -> Any:
    """`value` with every base64 image (markdown images, outputImages, inputImage) replaced by
    its format and size."""
    if isinstance(value, dict):
        return {k: images_as_sizes(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [images_as_sizes(item, key) for item in value]
    if isinstance(value, str) and (key == "inputImage" or key.endswith(".jpg") or key in (
        "layout_det_res", "preprocessed_img",
    )):  # fmt: skip
        with Image.open(io.BytesIO(base64.b64decode(value))) as image:
            return (image.format, image.size)
    return value


def asked(received: list[Received]) -> collections.Counter[tuple[Any, ...]]:
    """What a side asked its model: prompt, pixels, size, pixel bounds, sampling fields."""
    return collections.Counter((r.key, r.mm_processor_kwargs, r.sampling) for r in received)


@pytest.fixture(scope="module")
def sides(
    paddlex_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Received], list[Received]]:
    """(PaddleX's results, the gateway's results, what each side's model was asked)."""
    import asyncio  # noqa: PLC0415

    folder = tmp_path_factory.mktemp("corpus")
    documents = {doc.name: doc for doc in [*corpus.write(folder), blank(folder)]}
    layouts = {p.size: p.boxes for doc in documents.values() for p in doc.pages}
    requests = bodies(documents)
    with serving(StandinVLM()) as vlm:
        spec = {
            "mode": "infer", "server_url": f"{vlm.url}/v1", "layouts": layouts,
            "fixed_layout": str(FIXED_LAYOUT), "requests": requests,
        }  # fmt: skip
        expected = run_paddlex(spec, tmp_path_factory.mktemp("infer"))["answers"]
        paddlex_asked = list(vlm.received)

    async def read() -> tuple[list[dict[str, Any]], list[Received]]:
        standin = LayoutStandin(boxes=lambda width, height, _: layouts[f"{width}x{height}"])
        with serving(StandinVLM()) as model, serving(standin) as layout:
            async with gateway(model, layout, request_timeout=300) as client:
                got = []
                for body in requests:
                    response = await client.post("/layout-parsing", json=body)
                    assert response.status_code == 200, response.text
                    got.append(response.json()["result"])
            return got, list(model.received)

    got, gateway_asked = asyncio.run(read())
    return expected, got, paddlex_asked, gateway_asked


@pytest.mark.parametrize("run", range(len(RUNS)), ids=[f"{n}-{'-'.join(e)}" for n, e in RUNS])
def test_layout_parsing_equals_paddlexs_server(sides: Any, run: int) -> None:
    """The run's `result` is PaddleX's: every page's `prunedResult` (settings, blocks with ids,
    orders, groups and polygons, the layout boxes), markdown text and images, `outputImages`,
    `inputImage` and `dataInfo`."""
    expected, got, _, _ = sides
    assert images_as_sizes(got[run]) == images_as_sizes(expected[run])


def test_both_asked_the_model_the_same(sides: Any) -> None:
    """Both sides sent the same crops with the same prompts, pixel bounds and sampling fields
    (the request's `temperature`, `topP`, `repetitionPenalty`, `maxNewTokens`, `minPixels`,
    `maxPixels` included), each as often."""
    _, _, paddlex_asked, gateway_asked = sides
    assert asked(gateway_asked) == asked(paddlex_asked)
    fields = {name for r in paddlex_asked for name, _ in r.sampling}
    assert {"top_p", "repetition_penalty"} <= fields


def test_a_page_with_no_blocks_is_paddlexs_empty_page(sides: Any) -> None:
    """A page on which the layout finds no box: PaddleX's server answers it with no block, no
    layout box and empty markdown (nothing more says why), and the gateway answers the same."""
    expected, got, _, _ = sides
    run = [name for name, _ in RUNS].index("blank")
    (page,) = expected[run]["layoutParsingResults"]
    assert page["prunedResult"]["parsing_res_list"] == []
    assert page["prunedResult"]["layout_det_res"]["boxes"] == []
    assert page["markdown"]["text"] == ""
    assert images_as_sizes(got[run]) == images_as_sizes(expected[run])
