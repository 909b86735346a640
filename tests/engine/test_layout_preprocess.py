"""Document preprocessing in the layout service (tiny random checkpoints, CPU): PP-LCNet's
angle and the page turned, UVDoc's flattened page, in one forward pass per request, and the API
(`orientation`, `unwarp`: each result's `angle` and `image`, its boxes on that image)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import ENGINE_ONLY
from tests.support.layout_pages import layout_page, png
from tests.support.layout_service import (
    LayoutService,
    preprocessing_flags,
    start_layout_service,
    tiny_preprocess_dir,
)
from tests.support.pages import data_url

# torch and the service's models live in the engine venv: the gateway venv's passes skip the
# module (as conftest skips `engine` tests) instead of failing to collect it
torch = pytest.importorskip("torch", reason=ENGINE_ONLY)
from ocrvl_layout.orientation import OrientationModel, turned  # noqa: E402
from ocrvl_layout.preprocess import Preprocessor  # noqa: E402
from ocrvl_layout.unwarping import UnwarpingModel  # noqa: E402

pytestmark = pytest.mark.engine
CPU, FP32 = torch.device("cpu"), torch.float32
SIZES = ((620, 877), (877, 620), (500, 700))


def pages() -> list[np.ndarray]:
    return [np.asarray(layout_page(seed, w, h)) for seed, (w, h) in enumerate(SIZES)]


def test_the_classifier_gives_each_page_an_angle_alone_as_in_a_batch() -> None:
    """Four angles by label name; a page's angle is the same alone and in a batch of three."""
    model = OrientationModel(str(tiny_preprocess_dir() / "orientation"), CPU, FP32)
    assert sorted(model.angles) == [0, 90, 180, 270]
    together = model.angles_of(pages())
    assert [model.angles_of([page])[0] for page in pages()] == together
    assert set(together) <= {0, 90, 180, 270}


@pytest.mark.parametrize("angle", [0, 90, 180, 270])
def test_a_page_is_turned_counter_clockwise_as_paddlex_turns_it(angle: int) -> None:
    """rotate_image's right angles (OpenCV's warpAffine about w/2): the page turned
    counter-clockwise, then shifted one pixel (down at 90, down and right at 180, right at
    270), the edge it leaves black."""
    page = np.full((4, 6, 3), 9, dtype=np.uint8)
    page[1, 4] = 255
    out = turned(page, angle)
    assert out.shape[:2] == ((6, 4) if angle in (90, 270) else (4, 6))
    marker = {0: (1, 4), 90: (2, 1), 180: (3, 2), 270: (4, 3)}[angle]
    assert out[marker].tolist() == [255, 255, 255]
    black = {0: None, 90: out[0], 180: out[:, 0], 270: out[:, 0]}[angle]
    assert black is None or not black.any()


def test_unwarping_keeps_each_pages_size_in_one_pass() -> None:
    """UVDoc's output is each page at its own size, uint8 RGB, the same alone and batched (to
    a grey level: a batch's convolutions may add in another order)."""
    model = UnwarpingModel(str(tiny_preprocess_dir() / "unwarping"), CPU, FP32)
    flat = model.unwarp(pages())
    assert [page.shape for page in flat] == [(h, w, 3) for w, h in SIZES]
    assert all(page.dtype == np.uint8 for page in flat)
    alone = model.unwarp([pages()[1]])[0]
    assert np.abs(alone.astype(int) - flat[1].astype(int)).max() <= 1


def test_a_step_without_its_model_is_refused_naming_it() -> None:
    """A preprocessor with only the classifier refuses `unwarp` (400 model_not_loaded)."""
    steps = Preprocessor(str(tiny_preprocess_dir() / "orientation"), None, CPU, FP32)
    steps.require(True, False)
    with pytest.raises(Exception, match="`unwarp` is not available") as refused:
        steps.require(True, True)
    assert getattr(refused.value, "code", None) == "model_not_loaded"


@pytest.fixture(scope="module")
def preprocessing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LayoutService]:
    """The real service with the tiny preprocessing checkpoints."""
    log = tmp_path_factory.mktemp("layout-pre") / "layout.log"
    service = start_layout_service(log, *preprocessing_flags())
    yield service
    service.stop()


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/layout", json=body, timeout=300)


def decoded(url: str) -> Image.Image:
    head, _, payload = url.partition(",")
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(payload)))


def test_orientation_and_unwarping_answer_the_corrected_pages(
    preprocessing: LayoutService,
) -> None:
    """Three pages with both steps: each result's angle, its `image` (the page turned by it and
    flattened, a PNG), its size that image's, and its boxes inside it."""
    images = [data_url(png(layout_page(s, w, h)), "image/png") for s, (w, h) in enumerate(SIZES)]
    response = post(preprocessing.url, {"images": images, "orientation": True, "unwarp": True})
    assert response.status_code == 200, response.text
    for (width, height), result in zip(SIZES, response.json()["results"], strict=True):
        assert result["angle"] in (0, 90, 180, 270)
        turned_size = (height, width) if result["angle"] in (90, 270) else (width, height)
        assert (result["width"], result["height"]) == turned_size
        with decoded(result["image"]) as image:
            assert image.size == turned_size
        for box in result["boxes"]:
            x1, y1, x2, y2 = box["coordinate"]
            assert 0 <= x1 < x2 <= result["width"]
            assert 0 <= y1 < y2 <= result["height"]


def test_orientation_alone_gives_the_turned_page_only_when_it_turned(
    preprocessing: LayoutService,
) -> None:
    """`orientation` alone: `angle` always; `image` only when the angle is not 0, and then the
    sent page turned by it, pixel for pixel."""
    page = layout_page(7, 620, 877)
    body = {"images": [data_url(png(page), "image/png")], "orientation": True}
    [result] = post(preprocessing.url, body).json()["results"]
    if result["angle"] == 0:
        assert "image" not in result
    else:
        with decoded(result["image"]) as image:
            assert np.array_equal(np.asarray(image), turned(np.asarray(page), result["angle"]))
    plain = post(preprocessing.url, {"images": body["images"]}).json()["results"][0]
    assert "angle" not in plain
    assert "image" not in plain


def test_a_service_without_the_models_refuses_the_steps(layout_service: str) -> None:
    """The session's service has no preprocessing checkpoints: `orientation` and `unwarp` are
    400 `model_not_loaded` naming the field; a wrong type is 400 naming it."""
    image = data_url(png(layout_page(1, 300, 400)), "image/png")
    for name in ("orientation", "unwarp"):
        response = post(layout_service, {"images": [image], name: True})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("model_not_loaded", name)
    wrong = post(layout_service, {"images": [image], "orientation": "yes"})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["param"] == "orientation"


def test_the_tiny_checkpoints_are_transformers_own(tmp_path: Path) -> None:
    """The builder writes what transformers' classes load (config.json, safetensors)."""
    folder = tiny_preprocess_dir()
    for name in ("orientation", "unwarping"):
        assert (folder / name / "config.json").is_file()
        assert (folder / name / "model.safetensors").is_file()


def test_a_checkpoint_that_does_not_load_leaves_its_step_out_saying_why(tmp_path: Path) -> None:
    """An unwarping folder with no checkpoint: the classifier still loads, and `unwarp` is
    refused with the reason (the layout model serves on without it)."""
    steps = Preprocessor(str(tiny_preprocess_dir() / "orientation"), str(tmp_path), CPU, FP32)
    assert steps.orientation is not None
    assert steps.unwarping is None
    with pytest.raises(Exception, match=f"`unwarp` is not available.*{tmp_path}"):
        steps.require(False, True)
