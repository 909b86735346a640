"""PaddleX's own serving code for PaddleOCR-VL, run on saved JSON; writes what it made.

Runs in `.venv-paddleocr` (its pins clash with the gateway's) and imports nothing from the
project but tests/support/paddlex_fixed_layout.py (a script of that venv too). PaddleX's
serving package refuses to import without its serving plugin (FastAPI, uvicorn), which that
venv lacks; the schemas and helpers need neither, so the package is entered past its
`__init__` (`enter_serving`). The `infer` and `restructure` modes repeat the bodies of the
serving app's `_infer` and `_restructure_pages` (`basic_serving/_pipeline_apps/
paddleocr_vl.py`) line for line with PaddleX's own helpers (`file_to_images`, `prune_result`,
`postprocess_images`, the pipeline's `predict` and `restructure_pages`, `_to_markdown`), and
answer what the app's `response_model_exclude_none` would send.

    .venv-paddleocr/bin/python tests/paddlex/paddlex_serving.py SPEC.json OUT.json

SPEC: {"mode": "validate", "items": [{"model": "infer_request" | "infer_answer" |
"restructure_request" | "restructure_answer" | "error", "body": {...}}]}
    -> {"ok": true, "results": [{"valid": bool, "error": str?, "dumped": {...}?}]}
SPEC: {"mode": "restructure", "requests": [body, ...]} -> {"ok": true, "answers": [result]}
SPEC: {"mode": "infer", "server_url", "layouts", "fixed_layout": path, "requests": [body]}
    -> {"ok": true, "answers": [result]}
SPEC: {"mode": "soup", "html": [str]} / {"mode": "kmeans", "heights": [[int]]}
SPEC: {"mode": "spotting", "answers": [[answer, width, height]]} -> {"ok": true, "read": [...]}
SPEC: {"mode": "post", "url", "key", "requests": [body]} -> {"ok": true, "answers": [{"status",
    "answer", "valid", "error"?}]}: docs/clients.md's `requests.post` to URL/layout-parsing with
    each body, each 200 answer validated as `infer_answer`
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
import traceback
import types
from pathlib import Path
from typing import Any


def enter_serving() -> None:
    """Make `paddlex.inference.serving`'s modules importable without its plugin check."""
    from paddlex import inference  # noqa: PLC0415

    package = types.ModuleType("paddlex.inference.serving")
    package.__path__ = [str(Path(inference.__file__).parent / "serving")]
    sys.modules["paddlex.inference.serving"] = package


def validate(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each body against PaddleX's model; an answer also dumped as the app would send it."""
    from paddlex.inference.serving.infra.models import (  # noqa: PLC0415
        AIStudioNoResultResponse,
        AIStudioResultResponse,
    )
    from paddlex.inference.serving.schemas import paddleocr_vl as schema  # noqa: PLC0415
    from pydantic import TypeAdapter, ValidationError  # noqa: PLC0415

    models = {
        "infer_request": schema.InferRequest,
        "infer_answer": AIStudioResultResponse[schema.InferResult],
        "restructure_request": schema.RestructurePagesRequest,
        "restructure_answer": AIStudioResultResponse[schema.RestructurePagesResult],
        "error": AIStudioNoResultResponse,
    }
    out = []
    for item in items:
        model = models[item["model"]]
        try:
            parsed = model.model_validate(item["body"])
        except ValidationError as exc:
            out.append({"valid": False, "error": str(exc)})
            continue
        dumped = TypeAdapter(model).dump_python(parsed, exclude_none=True, mode="json")
        out.append({"valid": True, "dumped": dumped})
    return out


def post(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each body sent as docs/clients.md's snippet sends it (`requests.post`, a Bearer key), its
    status and answer, and PaddleX's verdict on a 200 answer."""
    import requests  # noqa: PLC0415

    out = []
    for body in spec["requests"]:
        response = requests.post(
            f"{spec['url']}/layout-parsing", json=body,
            headers={"Authorization": f"Bearer {spec['key']}"}, timeout=300,
        )  # fmt: skip
        answer = response.json()
        verdict = {"valid": False, "error": f"HTTP {response.status_code}"}
        if response.status_code == 200:
            verdict = validate([{"model": "infer_answer", "body": answer}])[0]
        out.append({"status": response.status_code, "answer": answer, **verdict})
    return out


def restructure(pipeline: Any, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`_restructure_pages` for each body (its `result`)."""
    from paddlex.inference.serving.basic_serving._pipeline_apps._common import (  # noqa: PLC0415
        common,
    )
    from paddlex.inference.serving.schemas.paddleocr_vl import (  # noqa: PLC0415
        RestructurePagesRequest,
    )

    answers = []
    for body in bodies:
        request = RestructurePagesRequest.model_validate(body)
        originals, markdown_images = [], {}
        for i, page in enumerate(request.pages):
            originals.append({"res": {**page.prunedResult, "input_path": "", "page_index": i}})
            if request.concatenatePages and page.markdownImages:
                markdown_images.update(page.markdownImages)
        restructured = list(
            pipeline.restructure_pages(
                originals, merge_tables=request.mergeTables, relevel_titles=request.relevelTitles,
                concatenate_pages=request.concatenatePages,
            )
        )  # fmt: skip
        results = []
        if request.concatenatePages:
            md = restructured[0]._to_markdown(
                pretty=request.prettifyMarkdown, show_formula_number=request.showFormulaNumber
            )
            images = markdown_images if request.returnMarkdownImages else None
            results.append(
                {
                    "prunedResult": common.prune_result(restructured[0].json["res"]),
                    "markdown": _dropped({"text": md["markdown_texts"], "images": images}),
                }
            )
        else:
            for new, old in zip(restructured, request.pages, strict=True):
                md = new._to_markdown(
                    pretty=request.prettifyMarkdown, show_formula_number=request.showFormulaNumber
                )
                images = old.markdownImages if request.returnMarkdownImages else None
                results.append(
                    {
                        "prunedResult": common.prune_result(new.json["res"]),
                        "markdown": _dropped({"text": md["markdown_texts"], "images": images}),
                    }
                )
        answers.append({"layoutParsingResults": results})
    return answers


def _dropped(value: dict[str, Any]) -> dict[str, Any]:
    return {key: item for key, item in value.items() if item is not None}


def infer(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """`_infer` for each body, through PaddleX's PaddleOCR-VL-1.5 pipeline with the spec's
    fixed layout boxes, at the spec's VLM (its `result`)."""
    fixed = _load(spec["fixed_layout"])
    layout = fixed.FixedLayout(spec["layouts"])
    fixed.install(layout)
    preprocess = spec.get("preprocess")  # {"angle": N}: the preprocessing models stubbed
    if preprocess is not None:
        _stub_preprocessing(preprocess["angle"])
    from paddleocr import PaddleOCRVL  # noqa: PLC0415
    from paddlex.inference.serving.basic_serving._pipeline_apps._common import (  # noqa: PLC0415
        common,
    )
    from paddlex.inference.serving.infra import utils  # noqa: PLC0415
    from paddlex.inference.serving.schemas.paddleocr_vl import InferRequest  # noqa: PLC0415

    steps = {} if preprocess is None else {
        "use_doc_orientation_classify": True, "use_doc_unwarping": True,
    }  # fmt: skip
    pipeline = PaddleOCRVL(
        pipeline_version="v1.5", vl_rec_backend="vllm-server",
        vl_rec_server_url=spec["server_url"], vl_rec_api_key=spec.get("api_key"), **steps,
    ).paddlex_pipeline  # fmt: skip
    answers = []
    for body in spec["requests"]:
        request = InferRequest.model_validate(body)
        kind = "PDF" if request.fileType == 0 else "IMAGE"
        images, data_info = utils.file_to_images(base64.b64decode(request.file), kind)
        result = list(pipeline.predict(images, **_predict_arguments(request)))
        if request.restructurePages:
            result = list(
                pipeline.restructure_pages(
                    result, merge_tables=request.mergeTables,
                    relevel_titles=request.relevelTitles, concatenate_pages=False,
                )
            )  # fmt: skip
        entries = []
        for i, (image, item) in enumerate(zip(images, result, strict=True)):
            md = item._to_markdown(
                pretty=request.prettifyMarkdown, show_formula_number=request.showFormulaNumber
            )
            md_images = None
            if request.returnMarkdownImages:
                md_images = common.postprocess_images(
                    md["markdown_images"], "log", filename_template=f"markdown_{i}/{{key}}",
                    max_img_size=(2000, 2000),
                )  # fmt: skip
            shown = {}
            if request.visualize is not False:
                shown = common.postprocess_images(
                    {"input_img": image, **item.img}, "log",
                    filename_template=f"{{key}}_{i}.jpg", max_img_size=(2000, 2000),
                )  # fmt: skip
            entry = {
                "prunedResult": common.prune_result(item.json["res"]),
                "markdown": _dropped({"text": md["markdown_texts"], "images": md_images}),
            }
            if shown:
                entry["outputImages"] = {k: v for k, v in shown.items() if k != "input_img"}
                entry["inputImage"] = shown["input_img"]
            entries.append(entry)
        answers.append({"layoutParsingResults": entries, "dataInfo": data_info.model_dump()})
    pipeline.close()
    return answers


def _stub_preprocessing(angle: int) -> None:
    """PaddleX's DocPreprocessor with its two models stubbed (PaddlePaddle's, which this venv
    lacks): the orientation classifier answers `angle` for every page (its label name), the
    unwarping model gives each page back as it got it (its `doctr_img` is RGB). Everything
    around them (the rotation, the sizes, the results) is PaddleX's."""
    from paddlex.inference.pipelines.doc_preprocessor import pipeline  # noqa: PLC0415

    def orientation(images: list[Any]) -> Any:
        for _ in images:
            yield {"label_names": [str(angle)]}

    def unwarping(images: list[Any]) -> Any:
        for image in images:
            yield {"doctr_img": image[:, :, ::-1]}

    stubs = {"doc_text_orientation": orientation, "image_unwarping": unwarping}
    original = pipeline._DocPreprocessorPipeline.create_model

    def create_model(self: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        stub = stubs.get(config.get("module_name", ""))
        return stub if stub is not None else original(self, config, **kwargs)

    pipeline._DocPreprocessorPipeline.create_model = create_model


def _predict_arguments(request: Any) -> dict[str, Any]:
    """What `_infer` passes to `pipeline.infer`."""
    return {
        "use_doc_orientation_classify": request.useDocOrientationClassify,
        "use_doc_unwarping": request.useDocUnwarping,
        "use_layout_detection": request.useLayoutDetection,
        "use_chart_recognition": request.useChartRecognition,
        "use_seal_recognition": request.useSealRecognition,
        "use_ocr_for_image_block": request.useOcrForImageBlock,
        "layout_threshold": request.layoutThreshold,
        "layout_nms": request.layoutNms,
        "layout_unclip_ratio": request.layoutUnclipRatio,
        "layout_merge_bboxes_mode": request.layoutMergeBboxesMode,
        "layout_shape_mode": request.layoutShapeMode,
        "prompt_label": request.promptLabel,
        "format_block_content": request.formatBlockContent,
        "repetition_penalty": request.repetitionPenalty,
        "temperature": request.temperature,
        "top_p": request.topP,
        "min_pixels": request.minPixels,
        "max_pixels": request.maxPixels,
        "max_new_tokens": request.maxNewTokens,
        "merge_layout_blocks": request.mergeLayoutBlocks,
        "markdown_ignore_labels": request.markdownIgnoreLabels,
        "vlm_extra_args": request.vlmExtraArgs,
    }


def _spotted(answer: str, width: int, height: int) -> list[Any]:
    """A spotting block's content as `_paddleocr_vl_assemble_parsing_results` makes it: loops
    cut, math delimiters rewritten (its inline code, copied), `post_process_for_spotting`."""
    from paddlex.inference.pipelines.paddleocr_vl import uilts  # noqa: PLC0415

    text = uilts.truncate_repetitive_content(answer, min_count=50)
    if ("\\(" in text and "\\)" in text) or ("\\[" in text and "\\]" in text):
        text = text.replace("$", "")
        text = (
            text.replace("\\(", " $ ")
            .replace("\\)", " $")
            .replace("\\[\\[", "\\[")
            .replace("\\]\\]", "\\]")
            .replace("\\[", " $$ ")
            .replace("\\]", " $$ ")
        )
    content, found = uilts.post_process_for_spotting(text, width, height)
    return [content, found]


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("paddlex_fixed_layout", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's mode."""
    mode = spec["mode"]
    if mode == "soup":
        from bs4 import BeautifulSoup  # noqa: PLC0415

        return {"ok": True, "html": [str(BeautifulSoup(h, "html.parser")) for h in spec["html"]]}
    if mode == "spotting":
        return {"ok": True, "read": [_spotted(*item) for item in spec["answers"]]}
    if mode == "kmeans":
        from paddlex.inference.pipelines.layout_parsing import title_level  # noqa: PLC0415

        clusters = [
            {str(k): v for k, v in title_level.cluster_global_heights(
                [{"height": h} for h in heights]).items()}
            for heights in spec["heights"]
        ]  # fmt: skip
        return {"ok": True, "clusters": clusters}
    enter_serving()
    if mode == "validate":
        return {"ok": True, "results": validate(spec["items"])}
    if mode == "restructure":
        from paddlex.inference.pipelines.paddleocr_vl.pipeline import (  # noqa: PLC0415
            _PaddleOCRVLPipeline,
        )

        pipeline = types.SimpleNamespace(
            restructure_pages=lambda *a, **k: _PaddleOCRVLPipeline.restructure_pages(None, *a, **k)
        )
        return {"ok": True, "answers": restructure(pipeline, spec["requests"])}
    if mode in ("infer", "post"):
        return {"ok": True, "answers": (infer if mode == "infer" else post)(spec)}
    raise ValueError(f"unknown mode {mode!r}")


def main() -> int:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as file:
        spec = json.load(file)
    try:
        report = run(spec)
    except Exception as exc:  # every failure goes to the test, with its traceback
        error = {"type": type(exc).__name__, "message": str(exc)}
        report = {"ok": False, "error": {**error, "traceback": traceback.format_exc()}}
    with open(out_path, "w") as out:
        json.dump(report, out, default=str)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
