"""The routes' requests and answers against PaddleX's own pydantic models.

PaddleX's `paddlex.inference.serving.schemas.paddleocr_vl` (`InferRequest`, `InferResult`,
`RestructurePagesRequest`, `RestructurePagesResult`) and its envelope (`AIStudioResultResponse`,
`AIStudioNoResultResponse`) run in `.venv-paddleocr` (tests/paddlex/paddlex_serving.py) on the
JSON the gateway answered, for images, PDFs and TIFFs, one page and several, with every
documented option. An answer must validate and be exactly what PaddleX's app would send for
it (its `response_model_exclude_none` dump: no field PaddleX lacks, no null it leaves out).
The bodies the gateway takes and refuses are the ones PaddleX's `InferRequest` takes and refuses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.paddlex import schema
from tests.paddlex.conftest import b64, gateway, page_png, run_paddlex, services
from tests.paddlex.documents import book
from tests.support.documents import pdf, tiff

pytestmark = pytest.mark.anyio
PNG, PDF3, TIFF2 = page_png(), pdf(3), tiff(2)
OPTIONS: list[dict[str, Any]] = [
    {},
    {"fileType": None},
    {"useDocOrientationClassify": False, "useDocUnwarping": False, "useOcrForImageBlock": False},
    {"useDocOrientationClassify": True, "useDocUnwarping": True, "visualize": True},
    {"useDocUnwarping": True},
    {"useLayoutDetection": True, "useChartRecognition": True, "useSealRecognition": True},
    {"layoutThreshold": 0.5, "layoutNms": False, "layoutUnclipRatio": 1.2},
    {"layoutThreshold": {"22": 0.4}, "layoutUnclipRatio": {"22": [1.0, 1.1]}},
    {"layoutMergeBboxesMode": "large", "layoutShapeMode": "rect"},
    {"layoutMergeBboxesMode": {"22": "small"}, "layoutShapeMode": "poly"},
    {"promptLabel": "table", "formatBlockContent": True},
    {"repetitionPenalty": 1.05, "temperature": 0.1, "topP": 0.9},
    {"minPixels": 50_000, "maxPixels": 800_000, "maxNewTokens": 64},
    {"mergeLayoutBlocks": False, "markdownIgnoreLabels": ["header"]},
    {"vlmExtraArgs": None, "outputFormats": None, "logId": "client-log-1"},
    {"prettifyMarkdown": False, "showFormulaNumber": True, "returnMarkdownImages": False},
    {"restructurePages": True, "mergeTables": False, "relevelTitles": False},
    {"restructurePages": True, "visualize": True},
    {"visualize": False},
    *({"useLayoutDetection": False, "promptLabel": label} for label in schema.PROMPT_LABELS),
    {"useOcrForImageBlock": True, "vlmExtraArgs": {"ocr_max_pixels": 600_000, "top_p": 0.5}},
    {"useLayoutDetection": False},
]
FILES = [(PNG, 1), (PDF3, 0), (TIFF2, 1)]
LOOPING = "Intro. " + "lorem ipsum " * 400
REFUSED_BY_BOTH: list[dict[str, Any]] = [
    {"fileType": 2},
    {"fileType": "1"},
    {"topP": 0},
    {"temperature": -1},
    {"repetitionPenalty": 0},
    {"promptLabel": "poem"},
    {"layoutMergeBboxesMode": "middle"},
    {"layoutMergeBboxesMode": {"1": 3}},
    {"layoutUnclipRatio": [1.0, 1.0]},  # PaddleX's own quirk: a pair arrives as a tuple
    {"layoutUnclipRatio": {"1": [1.0]}},
    {"layoutUnclipRatio": -1},
    {"layoutThreshold": 1.5},
    {"layoutThreshold": {"1": "high"}},
    {"layoutShapeMode": "circle"},
    {"minPixels": 0},
    {"maxPixels": 5, "minPixels": 10},
    {"maxNewTokens": -5},
    {"markdownIgnoreLabels": "header"},
    {"outputFormats": ["pdf"]},
    {"visualize": "perhaps"},
    {"useOcrForImageBlock": "maybe"},
    {"useDocOrientationClassify": "sideways"},
    {"vlmExtraArgs": [1]},
]
TAKEN_BY_BOTH: list[dict[str, Any]] = [
    {"fileType": 1.0},
    {"visualize": "true"},
    {"minPixels": "5000"},
    {"layoutThreshold": True},
    {"layoutThreshold": {"text": 0.3}},
    {"unknownField": 1},
    {"outputFormats": []},
]


@pytest.fixture(scope="module")
def answers() -> dict[str, list[dict[str, Any]]]:
    """What the gateway answered: every OPTIONS row on each file, restructured pages, errors."""

    async def collect() -> dict[str, list[dict[str, Any]]]:
        got: dict[str, list[dict[str, Any]]] = {"infer": [], "restructure": [], "error": []}
        got["health"] = []
        with services() as (fake, layout):
            async with gateway(fake, layout) as client:
                for data, kind in FILES:
                    for extra in OPTIONS:
                        body = {"file": b64(data), "fileType": kind, **extra}
                        response = await client.post("/layout-parsing", json=body)
                        assert response.status_code == 200, (extra, response.text)
                        got["infer"].append(response.json())
                pages = [{"prunedResult": r["prunedResult"]} for r in
                         got["infer"][len(OPTIONS)]["result"]["layoutParsingResults"]]  # fmt: skip
                for body in ({"pages": pages}, {"pages": [{"prunedResult": p} for p in book()],
                             "concatenatePages": True}):  # fmt: skip
                    response = await client.post("/restructure-pages", json=body)
                    assert response.status_code == 200, response.text
                    got["restructure"].append(response.json())
                refused = {"file": b64(PNG), "useDocUnwarping": True, "useLayoutDetection": False}
                for body in ({"file": "%%%"}, refused):
                    got["error"].append((await client.post("/layout-parsing", json=body)).json())
                unauthorized = await client.post("/restructure-pages", json={}, headers={})
                got["error"].append(unauthorized.json())
                got["health"].append((await client.get("/health", headers={})).json())
                fake.answers["OCR:"] = LOOPING  # a block the loop guard stops
                response = await client.post("/layout-parsing", json={"file": b64(PNG)})
                got["looped"] = [response.json()]
        return got

    return asyncio.run(collect())


@pytest.fixture(scope="module")
def validated(
    answers: dict[str, list[dict[str, Any]]],
    paddlex_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[dict[str, Any]]:
    """PaddleX's verdict on every answer and request (in one run of its code)."""
    items = [{"model": "infer_answer", "body": body} for body in answers["infer"]]
    items += [{"model": "restructure_answer", "body": body} for body in answers["restructure"]]
    items += [{"model": "error", "body": body} for body in answers["error"]]
    items += [{"model": "infer_answer", "body": body} for body in answers["looped"]]
    items += [{"model": "error", "body": body} for body in answers["health"]]
    for extra in OPTIONS:
        items.append({"model": "infer_request", "body": {"file": "x", "fileType": 1, **extra}})
    for extra in REFUSED_BY_BOTH + TAKEN_BY_BOTH:
        items.append({"model": "infer_request", "body": {"file": "x", **extra}})
    items.append({"model": "restructure_request", "body": {"pages": [{"prunedResult": {}}]}})
    results: list[dict[str, Any]] = run_paddlex(
        {"mode": "validate", "items": items}, tmp_path_factory.mktemp("validate")
    )["results"]
    return results


def test_every_answer_is_paddlexs_to_the_field(
    answers: dict[str, list[dict[str, Any]]], validated: list[dict[str, Any]]
) -> None:
    """Each `/layout-parsing` and `/restructure-pages` answer and each error envelope validates
    against PaddleX's models and is what PaddleX's app would write for it."""
    bodies = answers["infer"] + answers["restructure"] + answers["error"] + answers["looped"]
    for body, verdict in zip(bodies, validated, strict=False):
        assert verdict["valid"], verdict["error"]
        assert verdict["dumped"] == body


def test_health_is_paddlexs_health_answer_too(
    answers: dict[str, list[dict[str, Any]]], validated: list[dict[str, Any]]
) -> None:
    """`GET /health` is PaddleX's serving health answer to the field (its
    `AIStudioNoResultResponse`: `errorCode` 0, `errorMsg` "Healthy", a `logId`), plus our
    `status`."""
    (health,) = answers["health"]
    kinds = ("infer", "restructure", "error", "looped")
    verdict = validated[sum(len(answers[kind]) for kind in kinds)]
    assert verdict["valid"], verdict["error"]
    assert health == {**verdict["dumped"], "status": "ok"}
    assert (health["errorCode"], health["errorMsg"]) == (0, "Healthy")


def test_a_stopped_block_keeps_paddlexs_shape(
    answers: dict[str, list[dict[str, Any]]], validated: list[dict[str, Any]]
) -> None:
    """A block the loop guard stopped carries `stopped` and `loop` in `parsing_res_list` (extra
    fields PaddleX's clients ignore), its content cut to one unit; PaddleX's models take the
    answer and dump it unchanged (the previous test covers it too, by position)."""
    (looped,) = answers["looped"]
    (page,) = looped["result"]["layoutParsingResults"]
    stopped = [b for b in page["prunedResult"]["parsing_res_list"] if "stopped" in b]
    assert "text" in [b["block_label"] for b in stopped]
    for block in stopped:
        assert block["stopped"] == "repetition"
        assert block["loop"]["unit"] == len("lorem ipsum ")
        assert block["block_content"].count("lorem ipsum") == 1
    assert "lorem ipsum lorem ipsum" not in page["markdown"]["text"]
    bodies = answers["infer"] + answers["restructure"] + answers["error"]
    verdict = validated[len(bodies)]
    assert verdict["valid"], verdict["error"]
    assert verdict["dumped"] == looped


def test_the_answers_cover_each_file_kind_and_page_count(
    answers: dict[str, list[dict[str, Any]]],
) -> None:
    """An image, a 3-page PDF and a 2-frame TIFF: `dataInfo` says which, with each page's size,
    and one result comes back per page."""
    infos = [a["result"]["dataInfo"] for a in answers["infer"][:: len(OPTIONS)]]
    assert infos[0] == {"width": 600, "height": 800, "type": "image"}
    assert infos[1]["type"] == "pdf"
    assert infos[1]["numPages"] == 3
    assert infos[2]["type"] == "tiff"
    assert infos[2]["numPages"] == 2
    counts = [len(a["result"]["layoutParsingResults"]) for a in answers["infer"][:: len(OPTIONS)]]
    assert counts == [1, 3, 2]


def test_requests_are_taken_and_refused_as_paddlex_takes_them(
    validated: list[dict[str, Any]],
) -> None:
    """Every OPTIONS row and TAKEN_BY_BOTH body is valid for PaddleX and for the gateway; each
    REFUSED_BY_BOTH body is refused by both, the gateway naming the field."""
    verdicts = validated[-(len(OPTIONS) + len(REFUSED_BY_BOTH) + len(TAKEN_BY_BOTH) + 1) :]
    for extra, verdict in zip(OPTIONS, verdicts, strict=False):
        assert verdict["valid"], (extra, verdict["error"])
        schema.parse(schema.InferRequest, {"file": "x", "fileType": 1, **extra})
    refused = verdicts[len(OPTIONS) : len(OPTIONS) + len(REFUSED_BY_BOTH)]
    for extra, verdict in zip(REFUSED_BY_BOTH, refused, strict=True):
        assert not verdict["valid"], extra
        with pytest.raises(InvalidRequest) as caught:
            schema.parse(schema.InferRequest, {"file": "x", **extra})
        assert caught.value.param == next(iter(extra)), extra
    taken = verdicts[len(OPTIONS) + len(REFUSED_BY_BOTH) : -1]
    for extra, verdict in zip(TAKEN_BY_BOTH, taken, strict=True):
        assert verdict["valid"], (extra, verdict["error"])
        schema.parse(schema.InferRequest, {"file": "x", **extra})
    assert verdicts[-1]["valid"]
