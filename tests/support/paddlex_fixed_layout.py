"""Run PaddleX's own PaddleOCR-VL-1.5 pipeline with fixed layout boxes; write what it made.

Runs in `.venv-paddleocr` (`make paddleocr-venv`), so it imports nothing from the project;
tests/support/paddlex_pipeline.py runs it. The pipeline is PaddleOCR's `PaddleOCRVL`
(`pipeline_version="v1.5"`, PaddleX `configs/pipelines/PaddleOCR-VL-1.5.yaml`) with
`vl_rec_backend="vllm-server"` at `--spec`'s server, orientation and unwarping off, and one
stand-in: its layout model. PaddleX builds that model in `_PaddleOCRVLPipeline.__init__` by
`self.create_model(<the LayoutDetection config>)` (PP-DocLayoutV3 on PaddlePaddle, which this
venv lacks) and calls it once per page batch in `predict()`'s `_process_cv` as
`self.layout_det_model(images, threshold=…, layout_nms=…, …, filter_overlap_boxes=False)`,
taking each result's `boxes`. The stand-in returned by the patched `create_model` is that
callable: it answers each page with the spec's boxes for the page's size (a
`LayoutAnalysisResult`, the real model's result class), as the real model's post-processing
leaves them (`restructured_boxes`: int coordinates, `order`; `polygon_points` as float32
arrays). Everything after it (overlap filtering, crops, block merging, prompts, the requests to
the VLM, assembly, markdown) is PaddleX's code, unchanged.

    .venv-paddleocr/bin/python tests/support/paddlex_fixed_layout.py SPEC.json OUT.json

SPEC: {"server_url": ".../v1", "api_key": "...", "inputs": [path, ...],
"layouts": {"WxH": [box, ...]}, "predict": {keyword arguments of predict()}}.
OUT: {"ok": true, "pages": [...], "layout_calls": [...]} or {"ok": false, "error": {...}};
exit 0 or 1.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import time
import traceback
from types import SimpleNamespace
from typing import Any


class FixedLayout:
    """The layout model's stand-in: the spec's boxes for each page, by the page's size."""

    def __init__(self, layouts: dict[str, list[dict[str, Any]]]) -> None:
        self.layouts = layouts
        self.batch_sampler = SimpleNamespace(batch_size=8)  # the config's LayoutDetection one
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, images: list[Any], **options: Any) -> Any:
        import numpy as np  # noqa: PLC0415 (this venv's)
        from paddlex.inference.models.layout_analysis.result import (  # noqa: PLC0415
            LayoutAnalysisResult,
        )

        for image in images:
            height, width = image.shape[:2]
            size = f"{width}x{height}"
            with self._lock:
                self.calls.append({"size": size, "options": options})
            if size not in self.layouts:
                raise KeyError(f"no boxes for a page of {size}; the spec has {list(self.layouts)}")
            boxes = copy.deepcopy(self.layouts[size])
            for box in boxes:
                if box.get("polygon_points") is not None:
                    box["polygon_points"] = np.asarray(box["polygon_points"], dtype=np.float32)
            yield LayoutAnalysisResult(
                {"input_path": None, "page_index": None, "input_img": image, "boxes": boxes}
            )


def install(layout: FixedLayout) -> None:
    """Make the PaddleOCR-VL pipeline build `layout` in place of its layout model."""
    from paddlex.inference.pipelines.paddleocr_vl.pipeline import (  # noqa: PLC0415
        _PaddleOCRVLPipeline,
    )

    original = _PaddleOCRVLPipeline.create_model

    def create_model(self: Any, config: dict[str, Any], **kwargs: Any) -> Any:
        if config.get("module_name") == "layout_detection":
            return layout
        return original(self, config, **kwargs)

    _PaddleOCRVLPipeline.create_model = create_model


def page_report(result: Any) -> dict[str, Any]:
    """One page: its markdown (PaddleX's default, pretty; and as `save_to_markdown` writes it
    unprettified or with formula numbers) and its JSON result's block list."""
    data = result.json["res"]
    markdown = result.markdown
    return {
        "input_path": data["input_path"],
        "page_index": data["page_index"],
        "width": data["width"],
        "height": data["height"],
        "markdown": markdown["markdown_texts"],
        "markdown_plain": result._to_markdown(pretty=False)["markdown_texts"],
        "markdown_numbered": result._to_markdown(show_formula_number=True)["markdown_texts"],
        "markdown_images": {
            path: list(image.size) for path, image in markdown["markdown_images"].items()
        },
        "blocks": data["parsing_res_list"],
        "layout_boxes": data["layout_det_res"]["boxes"],
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the pipeline with the fixed layout, run every input, report every page."""
    layout = FixedLayout(spec["layouts"])
    install(layout)
    from paddleocr import PaddleOCRVL  # noqa: PLC0415 (after the patch)

    started = time.monotonic()
    pipeline = PaddleOCRVL(
        pipeline_version="v1.5",
        vl_rec_backend="vllm-server",
        vl_rec_server_url=spec["server_url"],
        vl_rec_api_key=spec.get("api_key"),
        use_doc_orientation_classify=False,
        use_doc_unwarping=False,
        use_layout_detection=True,
    )
    if pipeline.paddlex_pipeline.layout_det_model is not layout:
        raise RuntimeError("the pipeline did not take the stand-in layout model")
    pages = []
    for path in spec["inputs"]:
        for result in pipeline.predict(path, **spec.get("predict", {})):
            pages.append(page_report(result))
    pipeline.close()
    seconds = time.monotonic() - started
    return {"ok": True, "pages": pages, "layout_calls": layout.calls, "seconds": seconds}


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
        json.dump(report, out, indent=1, default=str)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
