"""The layout model's CUDA graphs (engine/layout/ocrvl_layout/graphs.py) as far as a CPU shows
them: the captured sizes, a batch run in the smallest size that holds it with its outputs cut
to its pages, a graph that differs from the eager pass refused, a model on the CPU left eager,
and a forward pass of the full-size config that copies nothing from the host (which a CUDA graph
cannot hold; run on PyTorch's meta device, shapes without data).

CUDA graphs cannot run here, so the capture is a fake (`ReplayingCapture`): its "graph" runs the
recorded pass again and writes the answers into the outputs it returned at capture, as a CUDA
graph writes into its static outputs. Everything around it (the static inputs, the padding, the
cut, the check against the eager pass) is the real code on the real tiny PP-DocLayoutV3; the
graphs themselves are measured on the H200 (bench/gpu)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ocrvl_layout.detections import RawOutputs  # noqa: E402
from ocrvl_layout.graphs import (  # noqa: E402
    GraphedForward,
    ScalarFills,
    box_of_masks,
    capturable,
    size_for,
    sizes_for,
)
from ocrvl_layout.model import BatchPage, LayoutModel  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from tests.support.layout_service import tiny_layout_dir  # noqa: E402

pytestmark = pytest.mark.engine


class ReplayingGraph:
    """A fake CUDA graph: replay runs the recorded pass and copies its answers into the outputs
    the capture returned (a CUDA graph's static outputs)."""

    def __init__(self, run: Callable[[], Any], outputs: Any, skew: float = 0.0) -> None:
        self.run, self.outputs, self.skew, self.replays = run, outputs, skew, 0

    def replay(self) -> None:
        self.replays += 1
        fresh = self.run()
        for f in fields(fresh):
            getattr(self.outputs, f.name).copy_(getattr(fresh, f.name) + self.skew)


class ReplayingCapture:
    """The capture GraphedForward is given: one ReplayingGraph per size, kept for the test."""

    def __init__(self, skew: float = 0.0) -> None:
        self.skew, self.graphs = skew, []

    def __call__(self, run: Callable[[], Any]) -> tuple[ReplayingGraph, Any]:
        outputs = run()
        graph = ReplayingGraph(run, outputs, self.skew)
        self.graphs.append(graph)
        return graph, outputs


@pytest.fixture(scope="module")
def model() -> LayoutModel:
    return LayoutModel(tiny_layout_dir(), "cpu")


def batch(model: LayoutModel, pages: int, seed: int) -> torch.Tensor:
    prep = model.preprocessing
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (pages, prep.height, prep.width, 3), dtype=np.uint8)
    return torch.from_numpy(pixels)


def test_sizes_are_powers_of_two_and_the_max_batch() -> None:
    assert sizes_for(1) == (1,)
    assert sizes_for(8) == (1, 2, 4, 8)
    assert sizes_for(12) == (1, 2, 4, 8, 12)
    chosen = [size_for(n, (1, 2, 4, 8, 12)) for n in (1, 2, 3, 5, 8, 9, 12)]
    assert chosen == [1, 2, 4, 8, 8, 12, 12]
    with pytest.raises(ValueError, match="past the largest"):
        size_for(13, (1, 2, 4, 8, 12))


def test_every_batch_equals_the_eager_pass_and_runs_in_the_smallest_size(
    model: LayoutModel,
) -> None:
    """Batches of 1 to 4 pages (sizes 1, 2, 4 captured: 3 pages run padded to 4): each one's
    outputs equal the eager pass's on the same pages (to 1e-3: float32 GEMMs of another batch
    size), cut to its pages, from the graph of the smallest size that holds it; the outputs are
    the graph's own tensors (overwritten by its next replay)."""
    capture = ReplayingCapture()
    with torch.inference_mode():
        graphed = GraphedForward(model.run, batch(model, 1, 0), sizes_for(4), capture)
        by_size = {g.outputs.logits.shape[0]: g for g in capture.graphs}
        assert sorted(by_size) == [1, 2, 4]
        for pages in range(1, 5):
            before = {size: g.replays for size, g in by_size.items()}
            pixels = batch(model, pages, seed=pages)
            got: RawOutputs = graphed(pixels)
            want = model.run(pixels)
            for f in fields(want):
                assert getattr(got, f.name).shape == getattr(want, f.name).shape
                # a padded batch runs other GEMM blockings than the eager one of its own size
                torch.testing.assert_close(
                    getattr(got, f.name), getattr(want, f.name), atol=1e-3, rtol=1e-3
                )
            ran = [size for size, g in by_size.items() if g.replays > before[size]]
            assert ran == [size_for(pages, graphed.sizes)]
            assert got.logits.data_ptr() == by_size[ran[0]].outputs.logits.data_ptr()


def test_a_graph_that_differs_from_the_eager_pass_is_refused(model: LayoutModel) -> None:
    with torch.inference_mode(), pytest.raises(ValueError, match="differ from the eager"):
        GraphedForward(model.run, batch(model, 1, 0), (1, 2), ReplayingCapture(skew=0.5))


def test_on_the_cpu_the_model_stays_eager_and_says_so(model: LayoutModel) -> None:
    assert model.capture(8) == "off (not on a GPU)"
    assert model.graphed is None
    assert "CUDA graphs off (not on a GPU)" in model.describe()
    prep = model.preprocessing
    page = BatchPage(batch(model, 1, 3).numpy()[0], prep.width, prep.height, 0.3)
    assert len(model.detect([page, page])) == 2


def test_the_raw_outputs_hold_the_last_decoder_layers_masks_alone(tmp_path: Path) -> None:
    """transformers' out_masks is a view into every decoder layer's masks: the raw outputs keep
    a copy of the last layer's alone, so neither a batch waiting for its post-processing nor a
    captured graph's static outputs hold the others (on the H200 the graphs of 1, 2, 4 and 8
    pages held 2.2 GiB at rest that way). The tiny checkpoint given two decoder layers."""
    folder = tmp_path / "two-decoder-layers"
    shutil.copytree(tiny_layout_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["decoder_layers"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    two = LayoutModel(folder, "cpu")
    with torch.inference_mode():
        raw = two.run(batch(two, 2, seed=4))
        stack = two.forward(
            pixel_values=two.preprocessing.normalise(batch(two, 2, seed=4), two.dtype, two.scaling)
        ).out_masks
    masks = raw.out_masks
    assert stack.untyped_storage().nbytes() == 2 * stack.numel() * stack.element_size()
    assert masks.untyped_storage().nbytes() == masks.numel() * masks.element_size()
    assert torch.equal(masks, stack)


def modeling() -> Any:
    from transformers.models.pp_doclayout_v3 import (  # noqa: PLC0415
        modeling_pp_doclayout_v3,
    )

    return modeling_pp_doclayout_v3


def transformers_boxes() -> Callable[..., torch.Tensor]:
    """transformers' own mask_to_box_coordinate, before or after `capturable` replaced it."""
    module = modeling()
    found: Callable[..., torch.Tensor] = getattr(
        module, "transformers_mask_to_box_coordinate", module.mask_to_box_coordinate
    )
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_box_of_masks_is_transformers_mask_to_box_coordinate(dtype: torch.dtype) -> None:
    """Random masks of 300 queries at 200x200 (the full model's), some empty: the same boxes."""
    generator = torch.Generator().manual_seed(1)
    masks = torch.rand(2, 300, 200, 200, generator=generator) > 0.97
    masks[0, :20] = False  # empty masks: their box is all zeros
    masks[1, 5, 10:30, 40:90] = True
    torch.testing.assert_close(box_of_masks(masks, dtype), transformers_boxes()(masks, dtype),
                               atol=0, rtol=0)  # fmt: skip


class HostCopies(TorchDispatchMode):
    """Every op, while active, that takes a host tensor and gives a device (meta) one: a copy
    from the host (`.to(device)`, `copy_`), which torch.tensor's own hides from this mode."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        made = out if isinstance(out, tuple | list) else [out]
        if any(t.device.type == "cpu" for t in given) and any(
            isinstance(t, torch.Tensor) and t.device.type == "meta" for t in made
        ):
            self.seen.append(str(func))
        return out


class DeviceTensors:
    """torch.tensor calls that put data on a device other than the host's, while active."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.real = torch.tensor

    def __enter__(self) -> DeviceTensors:
        def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
            made = self.real(*args, **kwargs)
            if made.device.type != "cpu":
                self.made.append(f"{tuple(made.shape)} on {made.device}")
            return made

        torch.tensor = spy
        return self

    def __exit__(self, *_: object) -> None:
        torch.tensor = self.real


def test_the_full_size_forward_pass_copies_nothing_from_the_host_once_capturable() -> None:
    """PP-DocLayoutV3 at transformers' default (released) config, `mask_enhanced` as the real
    checkpoint, on the meta device: transformers' own pass makes a tensor on the device from
    host data (the test can see one), and none once `capturable` replaced it."""
    from transformers import PPDocLayoutV3Config, PPDocLayoutV3ForObjectDetection  # noqa: PLC0415

    config = PPDocLayoutV3Config()
    assert config.mask_enhanced
    with torch.device("meta"):
        full = PPDocLayoutV3ForObjectDetection(config).eval()
    pixels = torch.empty(2, 3, 800, 800, device="meta")
    module = modeling()
    now = module.mask_to_box_coordinate
    try:
        module.mask_to_box_coordinate = transformers_boxes()
        with torch.inference_mode(), DeviceTensors() as before:
            full(pixel_values=pixels)
        assert before.made == ["(4,) on meta"]
        capturable()
        with torch.inference_mode(), DeviceTensors() as after, HostCopies() as copies:
            full(pixel_values=pixels)
        assert after.made == []
        assert copies.seen == []
    finally:
        module.mask_to_box_coordinate = now


class CudaSetitem:
    """`tensor[index] = number` on the meta device as torch does it on CUDA
    (at::indexing::set_item): the number made a host tensor, then copied into the indexed view
    (filled where the view has more than one element). On meta torch makes the number on the
    device itself, so without this the test could not see the copies a CUDA pass makes."""

    def __enter__(self) -> CudaSetitem:
        self.real = torch.Tensor.__setitem__

        def setitem(tensor: torch.Tensor, index: Any, value: Any) -> None:
            if tensor.device.type != "meta" or not isinstance(value, int | float | bool):
                self.real(tensor, index, value)
                return
            host = torch.tensor(value, dtype=tensor.dtype)
            view = tensor[index]
            view.copy_(host) if view.dim() == 0 else view.fill_(host)

        torch.Tensor.__setitem__ = setitem  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        torch.Tensor.__setitem__ = self.real  # type: ignore[method-assign]


def test_one_host_value_copied_to_the_device_is_a_fill_while_capturing() -> None:
    """Under ScalarFills, a copy of one host value into a device tensor is a fill of it (a
    graph can hold that); a copy of more than one value is left as it is (and fails a capture)."""
    target = torch.zeros(3, 2, dtype=torch.long, device="meta")
    with HostCopies() as copies, ScalarFills():
        target[1, 0].copy_(torch.tensor(7))
        target[2].copy_(torch.tensor([1, 2]))
    assert copies.seen == ["aten.copy_.default"]  # the two-value copy alone


def test_the_full_size_forward_pass_copies_nothing_from_the_host_under_scalar_fills() -> None:
    """The full-size PP-DocLayoutV3 with CUDA's indexed writes: each pass copies its feature
    levels' heights and widths from the host (what failed the first capture on a GPU), and
    nothing under ScalarFills, as cuda_capture captures."""
    from transformers import PPDocLayoutV3Config, PPDocLayoutV3ForObjectDetection  # noqa: PLC0415

    with torch.device("meta"):
        full = PPDocLayoutV3ForObjectDetection(PPDocLayoutV3Config()).eval()
    pixels = torch.empty(2, 3, 800, 800, device="meta")
    capturable()
    with torch.inference_mode(), CudaSetitem(), HostCopies() as eager:
        full(pixel_values=pixels)
    with torch.inference_mode(), CudaSetitem(), HostCopies() as captured, ScalarFills():
        full(pixel_values=pixels)
    assert "aten.copy_.default" in eager.seen
    assert captured.seen == []
