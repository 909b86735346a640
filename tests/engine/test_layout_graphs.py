"""The layout model's CUDA graphs (engine/layout/ocrvl_layout/graphs.py) as far as a CPU shows
them: the captured sizes, a batch run in the smallest size that holds it with its outputs cut
to its pages, a graph that differs from the eager pass refused, and a model on the CPU left eager.

CUDA graphs cannot run here, so the capture is a fake (`ReplayingCapture`): its "graph" runs the
recorded pass again and writes the answers into the outputs it returned at capture, as a CUDA
graph writes into its static outputs. Everything around it (the static inputs, the padding, the
cut, the check against the eager pass) is the real code on the real tiny PP-DocLayoutV3; the
graphs themselves are measured on the H200 (bench/gpu)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ocrvl_layout.detections import RawOutputs  # noqa: E402
from ocrvl_layout.graphs import GraphedForward, size_for, sizes_for  # noqa: E402
from ocrvl_layout.model import BatchPage, LayoutModel  # noqa: E402

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
    """Batches of 1 to 5 pages (sizes 1, 2, 4, 5 captured): each one's outputs equal the eager
    pass's on the same pages (to 1e-3: float32 GEMMs of another batch size), cut to its pages,
    from the graph of the smallest size that holds it; the outputs are the graph's own tensors
    (overwritten by its next replay)."""
    capture = ReplayingCapture()
    with torch.inference_mode():
        graphed = GraphedForward(model.run, batch(model, 1, 0), sizes_for(5), capture)
        by_size = {g.outputs.logits.shape[0]: g for g in capture.graphs}
        assert sorted(by_size) == [1, 2, 4, 5]
        for pages in range(1, 6):
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
