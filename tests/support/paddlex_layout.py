"""Run PaddleX's own layout post-processing on given candidates; write the boxes it makes.

Runs in `.venv-paddleocr` (PaddleX 3.7, no PaddlePaddle needed: the post-processing is numpy,
OpenCV and shapely), so it imports nothing from the project. The candidates are what
transformers' `post_process_object_detection` made of the tiny model's raw outputs (the test
runs that in the engine venv); this script does what PaddleX's transformers engine for
PP-DocLayoutV3 does with them (paddlex/inference/models/layout_analysis/predictor.py,
`LayoutAnalysisTransformersPredictor.process`): `_format_layout_transformers_output` on each
prediction, then `LayoutAnalysisProcess(...)(...)` with the case's options and
`filter_overlap_boxes=False`, as the PaddleOCR-VL pipeline calls its layout model.

    .venv-paddleocr/bin/python tests/support/paddlex_layout.py CASES.json OUT.json

CASES: {"labels": [...], "scale_size": [w, h], "cases": [{"name", "options": {threshold, layout_nms,
layout_unclip_ratio, layout_merge_bboxes_mode, layout_shape_mode}, "pages": [{"width", "height",
"scores", "labels", "boxes", "order_seq", "polygon_points"}]}]}. Per-class dicts arrive with
string keys (JSON) and are given to PaddleX with int keys, as its pipeline yaml has them.
OUT: {"cases": [{"name", "pages": [[box, ...], ...]}]}.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np


class Tensorish(np.ndarray):
    """A numpy array with the torch methods PaddleX's formatting calls (detach, cpu, numpy)."""

    def detach(self) -> Tensorish:
        return self

    def cpu(self) -> Tensorish:
        return self

    def numpy(self) -> np.ndarray:
        return np.asarray(self)


def tensor(values: Any, dtype: Any) -> Tensorish:
    return np.asarray(values, dtype=dtype).view(Tensorish)


def prediction(page: dict[str, Any]) -> dict[str, Any]:
    """One page's transformers prediction, as post_process_object_detection returns it."""
    boxes = np.asarray(page["boxes"], dtype=np.float32).reshape(-1, 4)
    return {
        "scores": tensor(page["scores"], np.float32),
        "labels": tensor(page["labels"], np.int64),
        "boxes": tensor(boxes, np.float32),
        "order_seq": tensor(page["order_seq"], np.int64),
        "polygon_points": [
            None if p is None else np.asarray(p, dtype=np.asarray(p).dtype)
            for p in page["polygon_points"]
        ],
    }


def int_keys(value: Any) -> Any:
    return {int(k): v for k, v in value.items()} if isinstance(value, dict) else value


def main(cases_path: str, out_path: str) -> int:
    from paddlex.inference.models.layout_analysis.predictor import (  # noqa: PLC0415
        LayoutAnalysisTransformersPredictor,
    )
    from paddlex.inference.models.layout_analysis.processors import (  # noqa: PLC0415
        LayoutAnalysisProcess,
    )
    from paddlex.inference.models.object_detection.predictor import (  # noqa: PLC0415
        DetTransformersPredictor,
    )

    with open(cases_path) as file:
        spec = json.load(file)
    process = LayoutAnalysisProcess(labels=spec["labels"], scale_size=spec["scale_size"])
    # the two formatting methods use nothing of the predictor but each other
    engine = SimpleNamespace()
    engine._format_transformers_output = lambda p: (
        DetTransformersPredictor._format_transformers_output(engine, p)
    )
    out = []
    for case in spec["cases"]:
        options = case["options"]
        outputs = [
            LayoutAnalysisTransformersPredictor._format_layout_transformers_output(
                engine, prediction(page)
            )
            for page in case["pages"]
        ]
        datas = [{"ori_img_size": [page["width"], page["height"]]} for page in case["pages"]]
        unclip = options["layout_unclip_ratio"]
        if isinstance(unclip, dict):
            unclip = {int(k): v for k, v in unclip.items()}
        pages = process(
            outputs,
            datas,
            threshold=int_keys(options["threshold"]),
            layout_nms=options["layout_nms"],
            layout_unclip_ratio=unclip,
            layout_merge_bboxes_mode=int_keys(options["layout_merge_bboxes_mode"]),
            layout_shape_mode=options["layout_shape_mode"],
            filter_overlap_boxes=False,
            skip_order_labels=None,
        )
        out.append(
            {"name": case["name"], "pages": [[plain(box) for box in page] for page in pages]}
        )
    with open(out_path, "w") as file:
        json.dump({"cases": out}, file)
    return 0


def plain(box: dict[str, Any]) -> dict[str, Any]:
    """A box as JSON: numpy values as Python's."""
    entry = {key: value for key, value in box.items() if key != "polygon_points"}
    if "polygon_points" in box:
        entry["polygon_points"] = np.asarray(box["polygon_points"], dtype=np.float64).tolist()
    return entry


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
