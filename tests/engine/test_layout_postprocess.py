"""The layout service's post-processing agrees with transformers' and PaddleX's own code.

The tiny PP-DocLayoutV3 (tests/support/tiny_layout.py) runs once on synthetic pages of five
shapes; its raw outputs are saved to .npy and read back by both sides. Then, for each
combination of options, three things are compared box by box:

* ocrvl_layout.detections against transformers' own `post_process_object_detection` (its image
  processor class needs torchvision, which the engine venv leaves out; the module is imported
  with empty stand-ins for the torchvision names it imports, then run unchanged);
* ocrvl_layout.postprocess against PaddleX's own `LayoutAnalysisProcess`, run in
  .venv-paddleocr by tests/support/paddlex_layout.py on transformers' candidates: labels,
  scores, coordinates, order and outlines, exactly as PaddleX's transformers engine makes them.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.layout_pages import layout_page
from tests.support.layout_service import tiny_layout_dir

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
PADDLEX_VENV = Path(os.environ.get("PADDLEOCR_VENV", ROOT / ".venv-paddleocr"))
SCRIPT = ROOT / "tests" / "support" / "paddlex_layout.py"
PAGE_SIZES = ((1240, 1754), (1754, 1240), (900, 900), (640, 1600), (2000, 1100))
# each case: overrides as a client sends them (JSON), over PaddleOCR-VL-1.5's defaults
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "nms_off": {"layout_nms": False},
    "no_merge": {"layout_merge_bboxes_mode": "union"},
    "low_rect": {
        "threshold": 0.2,
        "layout_shape_mode": "rect",
        "layout_merge_bboxes_mode": "union",
    },
    "merge_large_rect": {
        "threshold": 0.2,
        "layout_merge_bboxes_mode": "large",
        "layout_shape_mode": "rect",
    },
    "merge_small_rect": {
        "threshold": 0.2,
        "layout_merge_bboxes_mode": "small",
        "layout_shape_mode": "rect",
    },
    "merge_large": {"threshold": 0.2, "layout_merge_bboxes_mode": "large"},
    "merge_per_class": {
        "threshold": 0.2,
        "layout_merge_bboxes_mode": {
            "22": "small",
            "17": "large",
            "4": "small",
            "14": "large",
            "5": "small",
        },
    },
    "unclip": {"layout_unclip_ratio": [1.15, 0.9], "layout_nms": False},
    "unclip_per_class": {"layout_unclip_ratio": {"22": [1.1, 1.3], "14": [0.8, 0.8]}},
    "threshold_per_class": {"threshold": {"22": 0.25, "4": 0.2, "6": 0.35, "14": 0.1}},
    "poly": {"threshold": 0.2, "layout_shape_mode": "poly"},
    "quad": {"threshold": 0.2, "layout_shape_mode": "quad"},
}
# PaddleX's single "large"/"small" mode drops boxes but not their outlines (ocrvl_layout's
# postprocess docstring): there only the boxes can agree
OUTLINES_DIFFER = {"merge_large"}


@pytest.fixture(scope="module")
def model() -> Any:
    from ocrvl_layout.model import LayoutModel  # noqa: PLC0415

    return LayoutModel(tiny_layout_dir(), "cpu")


@pytest.fixture(scope="module")
def raw(model: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model's raw outputs on the pages, written to .npy and read back."""
    from ocrvl_layout.detections import RawOutputs  # noqa: PLC0415

    pages = [layout_page(seed, w, h) for seed, (w, h) in enumerate(PAGE_SIZES)]
    pixels = np.stack([model.preprocessing.resize(np.asarray(page)) for page in pages])
    outputs = model.outputs(pixels)
    folder = tmp_path_factory.mktemp("raw-outputs")
    for name in ("logits", "pred_boxes", "order_logits", "out_masks"):
        np.save(folder / f"{name}.npy", getattr(outputs, name).numpy())
    import torch  # noqa: PLC0415

    loaded = {n: torch.from_numpy(np.load(folder / f"{n}.npy")) for n in RawOutputs.__annotations__}
    return RawOutputs(**loaded)


def transformers_processor() -> Any:
    """transformers' PPDocLayoutV3ImageProcessor, its post-processing runnable without
    torchvision: the module is imported with empty stand-ins for the torchvision names it
    imports (its post-processing uses none of them), and the instance skips __init__."""
    import transformers.image_processing_backends  # noqa: F401, PLC0415  (torchvision: absent)

    names = (
        "torchvision",
        "torchvision.transforms",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
    )
    stand_ins = {name: types.ModuleType(name) for name in names if name not in sys.modules}
    sys.modules.update(stand_ins)
    sys.modules["torchvision.transforms.v2"].functional = sys.modules[names[-1]]  # type: ignore[attr-defined]
    try:
        module = importlib.import_module(
            "transformers.models.pp_doclayout_v3.image_processing_pp_doclayout_v3"
        )
    finally:
        for name in stand_ins:
            del sys.modules[name]
    processor = object.__new__(module.PPDocLayoutV3ImageProcessor)
    processor.size = {"height": 800, "width": 800}
    return processor


def options_of(overrides: dict[str, Any], labels: int) -> Any:
    from ocrvl_layout.options import parse_request  # noqa: PLC0415

    return parse_request({"images": ["x"], **overrides}, num_labels=labels, max_images=1).options


def as_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [as_json(v) for v in value]
    return value


def run_paddlex(spec: dict[str, Any], folder: Path) -> dict[str, list[list[dict[str, Any]]]]:
    python = PADDLEX_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no PaddleX venv at {PADDLEX_VENV}: run `make paddleocr-venv`")
    cases, out = folder / "cases.json", folder / "paddlex.json"
    cases.write_text(json.dumps(spec))
    done = subprocess.run(
        [str(python), str(SCRIPT), str(cases), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )
    assert done.returncode == 0, f"PaddleX's post-processing failed:\n{done.stderr[-4000:]}"
    return {case["name"]: case["pages"] for case in json.loads(out.read_text())["cases"]}


def candidate_json(prediction: dict[str, Any]) -> dict[str, Any]:
    return {
        "scores": prediction["scores"].tolist(),
        "labels": prediction["labels"].tolist(),
        "boxes": prediction["boxes"].tolist(),
        "order_seq": prediction["order_seq"].tolist(),
        "polygon_points": [
            None if p is None else np.asarray(p).tolist() for p in prediction["polygon_points"]
        ],
    }


def assert_same_candidates(ours: Any, theirs: dict[str, Any], theirs_outlines: list[Any]) -> None:
    from ocrvl_layout.detections import polygons  # noqa: PLC0415

    np.testing.assert_array_equal(ours.scores, theirs["scores"].numpy())
    np.testing.assert_array_equal(ours.labels, theirs["labels"].numpy())
    np.testing.assert_array_equal(ours.boxes, theirs["boxes"].numpy())
    np.testing.assert_array_equal(ours.order, theirs["order_seq"].numpy())
    for mine, other in zip(polygons(ours), theirs_outlines, strict=True):
        assert (mine is None) == (other is None)
        if mine is not None:
            np.testing.assert_allclose(mine, np.asarray(other), atol=1e-6)


def assert_same_boxes(
    name: str, ours: list[dict[str, Any]], theirs: list[dict[str, Any]], *, outlines: bool
) -> None:
    assert len(ours) == len(theirs), f"{name}: {len(ours)} boxes here, {len(theirs)} in PaddleX"
    for i, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        where = f"{name}, box {i}"
        assert (mine["cls_id"], mine["label"], mine["order"]) == (
            other["cls_id"],
            other["label"],
            other["order"],
        ), where
        assert mine["score"] == pytest.approx(other["score"], abs=1e-6), where
        np.testing.assert_allclose(
            mine["coordinate"], other["coordinate"], atol=1e-3, err_msg=where
        )
        assert ("polygon_points" in mine) == ("polygon_points" in other), where
        if "polygon_points" in mine and outlines:
            np.testing.assert_allclose(
                mine["polygon_points"], other["polygon_points"], atol=1e-3, err_msg=where
            )


def test_postprocessing_agrees_with_transformers_and_paddlex(
    model: Any, raw: Any, tmp_path: Path
) -> None:
    """On the same raw outputs, every case's candidates equal transformers' and every page's
    final boxes equal PaddleX's: labels, scores, coordinates, order and outlines."""
    import torch  # noqa: PLC0415
    from ocrvl_layout.detections import candidates  # noqa: PLC0415
    from ocrvl_layout.postprocess import layout_boxes  # noqa: PLC0415

    processor = transformers_processor()
    target_sizes = torch.tensor([[h, w] for w, h in PAGE_SIZES])
    ours: dict[str, list[list[dict[str, Any]]]] = {}
    spec: dict[str, Any] = {"labels": model.labels, "scale_size": [800, 800], "cases": []}
    for name, overrides in CASES.items():
        options = options_of(overrides, len(model.labels))
        threshold = 0.0 if isinstance(options.threshold, dict) else options.threshold
        found = candidates(raw, list(PAGE_SIZES), [threshold] * len(PAGE_SIZES), (800, 800))
        predictions = processor.post_process_object_detection(
            raw, threshold=threshold, target_sizes=target_sizes
        )
        for mine, theirs in zip(found, predictions, strict=True):
            assert_same_candidates(mine, theirs, theirs["polygon_points"])
        ours[name] = [layout_boxes(page, model.labels, options) for page in found]
        pages = [
            {"width": w, "height": h, **candidate_json(p)}
            for (w, h), p in zip(PAGE_SIZES, predictions, strict=True)
        ]
        settings = {
            key: as_json(getattr(options, key))
            for key in (
                "threshold",
                "layout_nms",
                "layout_unclip_ratio",
                "layout_merge_bboxes_mode",
                "layout_shape_mode",
            )
        }
        spec["cases"].append({"name": name, "options": settings, "pages": pages})
    paddlex = run_paddlex(spec, tmp_path)
    for name in CASES:
        for page, (mine, other) in enumerate(zip(ours[name], paddlex[name], strict=True)):
            where = f"{name}, page {page}"
            assert_same_boxes(where, mine, other, outlines=name not in OUTLINES_DIFFER)
    assert_cases_did_work(ours)


def count(pages: list[list[dict[str, Any]]]) -> int:
    return sum(len(page) for page in pages)


def assert_cases_did_work(ours: dict[str, list[list[dict[str, Any]]]]) -> None:
    """The tiny model's boxes give every rule work, so the agreement above means something."""
    assert count(ours["defaults"]) >= 20
    assert count(ours["nms_off"]) > count(ours["defaults"]), "NMS removed nothing"
    assert count(ours["merge_large_rect"]) < count(ours["low_rect"]), "'large' merged nothing"
    assert count(ours["merge_small_rect"]) < count(ours["low_rect"]), "'small' merged nothing"
    assert count(ours["threshold_per_class"]) != count(ours["defaults"])
    moved = [
        a["coordinate"] != b["coordinate"]
        for page_a, page_b in zip(ours["unclip"], ours["nms_off"], strict=True)
        for a, b in zip(page_a, page_b, strict=True)
    ]
    assert any(moved), "unclipping moved no box"
    orders = [box["order"] for page in ours["defaults"] for box in page]
    assert None in orders, "no unnumbered label (PaddleX's SKIP_ORDER_LABELS)"
    assert 1 in orders, "no reading order numbers"
    assert any(len(box["polygon_points"]) != 4 for page in ours["poly"] for box in page)


def test_each_page_of_a_batch_keeps_its_own_threshold(raw: Any) -> None:
    """A batch whose pages ask for different thresholds (two requests in one forward pass) gives
    each page the candidates it gets alone with its threshold: the one gather of the kept masks
    cuts at each page's own threshold."""
    from dataclasses import fields  # noqa: PLC0415

    from ocrvl_layout.detections import candidates  # noqa: PLC0415

    thresholds = [0.2, 0.6, 0.0, 0.4, 0.3]
    together = candidates(raw, list(PAGE_SIZES), thresholds, (800, 800))
    assert len({len(page.scores) for page in together}) > 1  # the thresholds keep different counts
    for page, (threshold, mine) in enumerate(zip(thresholds, together, strict=True)):
        alone = candidates(raw, list(PAGE_SIZES), [threshold] * len(PAGE_SIZES), (800, 800))
        for f in fields(mine):
            np.testing.assert_array_equal(getattr(mine, f.name), getattr(alone[page], f.name))


@pytest.mark.parametrize("width", [200, 13, 8])
@pytest.mark.parametrize("count", [0, 5])
def test_masks_are_packed_as_numpy_packs_bits(width: int, count: int) -> None:
    """The kept masks cross to the host packed on their device: bit for bit np.packbits of the
    masks along their width (a width not a multiple of 8 padded with zeros), no mask too."""
    import torch  # noqa: PLC0415
    from ocrvl_layout.detections import pack_bits  # noqa: PLC0415

    bits = torch.rand(count, 7, width, generator=torch.Generator().manual_seed(width)) > 0.5
    packed = pack_bits(bits).numpy()
    np.testing.assert_array_equal(packed, np.packbits(bits.numpy(), axis=-1))
    np.testing.assert_array_equal(np.unpackbits(packed, axis=-1, count=width), bits.numpy())
