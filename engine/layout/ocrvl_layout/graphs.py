"""CUDA graphs of the layout model's forward pass (`--cuda-graphs`, docs/layout.md).

Eager, PP-DocLayoutV3's forward is ~1,700 kernel launches, each through Python, each giving
the GIL up and taking it back: on an H200 a batch of 8 took 108.8 ms of wall time for 26.6 ms of
kernels (docs/h200.md, pass 12), and in the service, where the event loop wants the same GIL for
HTTP, ~140 ms (pass 13): the layout service was bound by its forward thread, not by its GPU. A
CUDA graph replays the whole pass in one call.

One graph per captured batch size (powers of two up to `--max-batch`, and `--max-batch`), all
in one memory pool, captured largest first after the eager warm-up; a batch of n pages runs in
the smallest captured size >= n, its rows past n left as they were and its outputs cut to n.
Every captured size is checked against the eager pass on a seeded random page before the
service says ready (the eager outputs taken first and kept on the host, so a capture's memory
never adds to an eager pass's); a size that differs, or a capture that fails, leaves the
model eager (logged). Graphs need CUDA: on the CPU, or with `--compile` (torch.compile's own),
the forward stays as it was.

A graph cannot hold a copy from the host, and transformers' PP-DocLayoutV3 makes one in every
pass where its config is `mask_enhanced` (the real checkpoint's, and the bench's): its
`mask_to_box_coordinate` builds a 4-vector with `torch.tensor(..., device=...)`. `capturable`
puts in its place the same function building that vector on the device (`box_of_masks`), before
any capture; tests/engine/test_layout_graphs.py checks both give the same boxes and that no
pass of the full-size config copies from the host then. It makes more on CUDA alone, which the
test's meta device cannot show: every pass writes each feature level's height and width into a
device tensor (`spatial_shapes[level, 0] = height`), and on CUDA torch turns each int into a host
tensor and copies it over (at::indexing::set_item). The first capture on a GPU (an H100, torch
2.11) failed so ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the
CPU tensor is pinned"); `ScalarFills`, on while a graph is captured, makes each such copy of one
host value a fill of that value, which a graph holds as a constant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger("ocrvl_layout")

# the largest difference allowed between a graph's outputs and the eager pass's on the same
# pages: the same kernels run in both, so any real difference is far larger than bf16's rounding
TOLERANCE = 1e-2


def sizes_for(max_batch: int) -> tuple[int, ...]:
    """The batch sizes captured for `max_batch`: powers of two below it, and itself."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch)


def size_for(pages: int, sizes: tuple[int, ...]) -> int:
    """The smallest captured size that holds `pages`; ValueError past the largest."""
    for size in sizes:
        if size >= pages:
            return size
    raise ValueError(f"a batch of {pages} pages is past the largest captured size {sizes[-1]}")


def box_of_masks(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """transformers' `mask_to_box_coordinate` (models/pp_doclayout_v3/modeling_pp_doclayout_v3.py,
    transformers 5.19, Apache-2.0) step for step, but for the normaliser [w, h, w, h], filled on
    the device instead of copied from the host: each mask's box, (cx, cy, w, h) in [0, 1]."""
    mask = mask.bool()
    height, width = mask.shape[-2:]
    y_coords, x_coords = torch.meshgrid(
        torch.arange(height, device=mask.device), torch.arange(width, device=mask.device),
        indexing="ij",
    )  # fmt: skip
    x_coords, y_coords = x_coords.to(dtype), y_coords.to(dtype)
    finfo_max = torch.full((), torch.finfo(dtype).max, dtype=dtype, device=mask.device)
    x_coords_masked = x_coords * mask
    x_max = x_coords_masked.flatten(start_dim=-2).max(dim=-1).values + 1
    x_min = torch.where(mask, x_coords_masked, finfo_max).flatten(start_dim=-2).min(dim=-1).values
    y_coords_masked = y_coords * mask
    y_max = y_coords_masked.flatten(start_dim=-2).max(dim=-1).values + 1
    y_min = torch.where(mask, y_coords_masked, finfo_max).flatten(start_dim=-2).min(dim=-1).values
    unnormalized_bbox = torch.stack([x_min, y_min, x_max, y_max], dim=-1)
    is_mask_non_empty = torch.any(mask, dim=(-2, -1)).unsqueeze(-1)
    unnormalized_bbox = unnormalized_bbox * is_mask_non_empty
    norm_tensor = torch.empty(4, device=mask.device, dtype=dtype)  # the one change
    norm_tensor[0::2] = width
    norm_tensor[1::2] = height
    normalized_bbox_xyxy = unnormalized_bbox / norm_tensor
    x_min_norm, y_min_norm, x_max_norm, y_max_norm = normalized_bbox_xyxy.unbind(dim=-1)
    center_x = (x_min_norm + x_max_norm) / 2
    center_y = (y_min_norm + y_max_norm) / 2
    box_width = x_max_norm - x_min_norm
    box_height = y_max_norm - y_min_norm
    return torch.stack([center_x, center_y, box_width, box_height], dim=-1)


def capturable() -> None:
    """transformers' PP-DocLayoutV3 forward without its one copy from the host (above)."""
    from transformers.models.pp_doclayout_v3 import (  # noqa: PLC0415
        modeling_pp_doclayout_v3 as modeling,
    )

    if modeling.mask_to_box_coordinate is not box_of_masks:
        modeling.transformers_mask_to_box_coordinate = modeling.mask_to_box_coordinate
        modeling.mask_to_box_coordinate = box_of_masks


class ScalarFills(TorchDispatchMode):
    """While active: a copy of one host value into a device tensor (or a fill from a host
    tensor) is a fill of that value as a number (module docstring); every other op, and any
    larger copy from the host, runs as it is."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten.copy_.default, torch.ops.aten.fill_.Tensor):
            target, source = args[0], args[1]
            if source.device.type == "cpu" and target.device.type != "cpu" and source.numel() == 1:
                return target.fill_(source.item())
        return func(*args, **(kwargs or {}))


class Graph(Protocol):
    """What torch.cuda.CUDAGraph gives here: record a pass once, replay it."""

    def replay(self) -> None: ...


Capture = Callable[[Callable[[], Any]], tuple[Graph, Any]]


def cuda_capture(device: torch.device) -> Capture:
    """torch's own capture on `device`, every graph in one pool (replayed one at a time). The
    first capture runs the pass once on a side stream before it, as torch's docs do; the later
    ones do not, so no eager pass's memory adds to the pool's."""
    pool = torch.cuda.graph_pool_handle()
    warmed: list[bool] = []

    def capture(run: Callable[[], Any]) -> tuple[Graph, Any]:
        if not warmed:
            # the eager passes' cache back first: blocks cached for the default stream are not
            # the side stream's, so kept they would add to its pass (6.9 GiB reserved at the
            # start on the H200, where the eager service never went past 4.1)
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream(device).wait_stream(side)
            warmed.append(True)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # eager passes' memory back before the graph's pool grows
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), ScalarFills():
            out = run()
        return graph, out

    return capture


@dataclass
class _Captured:
    pixels: torch.Tensor  # (size, H, W, 3) uint8, the graph's input, on the device
    graph: Graph
    outputs: Any  # the graph's outputs (a dataclass of tensors, overwritten by each replay)


class GraphedForward:
    """`forward(pixels)` (a (B, H, W, 3) uint8 batch on the device -> a dataclass of tensors
    with the batch first) replayed from a graph per captured size."""

    def __init__(
        self,
        forward: Callable[[torch.Tensor], Any],
        sample: torch.Tensor,
        sizes: tuple[int, ...],
        capture: Capture,
    ) -> None:
        """Capture `forward` at each size, largest first, on copies of `sample` (one page,
        (1, H, W, 3) uint8 on the device), and check each against the eager pass; ValueError
        naming the size whose outputs differ. The eager passes run first, their outputs kept on
        the host, so the memory the captures take never adds to an eager pass's."""
        self.sizes = tuple(sorted(sizes))
        self.captured: dict[int, _Captured] = {}
        order = sorted(sizes, reverse=True)
        inputs = {size: sample.expand(size, *sample.shape[1:]).clone() for size in order}
        expected = {size: on_host(forward(inputs[size])) for size in order}
        for size in order:
            graph, outputs = capture(lambda p=inputs[size]: forward(p))
            self.captured[size] = _Captured(inputs[size], graph, outputs)
            graph.replay()
            worst = difference(on_host(outputs), expected.pop(size))
            if worst > TOLERANCE:
                raise ValueError(f"batch {size}: the graph's outputs differ from the eager "
                                 f"pass's by {worst:.3g} (at most {TOLERANCE})")  # fmt: skip

    def __call__(self, pixels: torch.Tensor) -> Any:
        """The outputs for `pixels` (n pages on the device): views into the graph's outputs,
        valid until the next call."""
        pages = pixels.shape[0]
        captured = self.captured[size_for(pages, self.sizes)]
        captured.pixels[:pages].copy_(pixels)
        captured.graph.replay()
        out = captured.outputs
        return type(out)(**{f.name: getattr(out, f.name)[:pages] for f in fields(out)})


def on_host(outputs: Any) -> Any:
    """A dataclass of tensors copied to the host."""
    return type(outputs)(**{f.name: getattr(outputs, f.name).cpu() for f in fields(outputs)})


def difference(ours: Any, theirs: Any) -> float:
    """The largest absolute difference between two dataclasses of tensors, field by field."""
    return max(
        float((getattr(ours, f.name).float() - getattr(theirs, f.name).float()).abs().max())
        for f in fields(ours)
    )
