"""engine/vllm_plugin/ocrvl_vllm_plugin/graphs.py on the CPU: the SupportsEncoderCudaGraph
methods of the plugin's class, driven the way vLLM's EncoderCudaGraphManager drives them (its
own padding and scatter functions), give the eager embeddings. A CPU has no CUDA graph: the
buffers' forward is run where a GPU would replay it, the same code over the same buffers; the
capture and replay themselves are measured on the GPU (bench/gpu/plans/*-encoder.json)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY, tiny_model_dir

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason=ENGINE_ONLY)

with warnings.catch_warnings():  # torch's own DeprecationWarnings (torch.jit) on vLLM's import
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch
    from ocrvl_vllm_plugin import graphs
    from vllm.config import CompilationConfig, ModelConfig, VllmConfig
    from vllm.model_executor.models.interfaces import supports_encoder_cudagraph
    from vllm.model_executor.models.utils import scatter_output_slices
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.encoder_cudagraph import BudgetGraphMetadata, EncoderCudaGraphManager

    from bench.gpu import encoder_check

# Where the buffers and their forward run: the GPU would replay a graph over them
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> Any:
    """The plugin's class, built by vLLM on the CPU from the tiny checkpoint (float32)."""
    return encoder_check.pair(tiny_model_dir(), CPU, torch.float32)[1]


@pytest.fixture
def packed(model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The class with the CPU's ViT attention (TORCH_SDPA) let through `graphs.check`: it splits
    by host ints, which a real graph could not replay but the CPU's eager stand-in runs, for
    batches with no padded tail (every test below but the refusals')."""
    monkeypatch.setattr(graphs, "REPLAYABLE", graphs.REPLAYABLE | {AttentionBackendEnum.TORCH_SDPA})
    return model


def batch(grids: list[tuple[int, int, int]], seed: int = 0) -> dict[str, Any]:
    """A step's image inputs as vLLM hands them to the encoder (random pixels)."""
    return encoder_check.inputs(grids, CPU, seed)


def replayed(model: Any, kwargs: dict[str, Any], budget: int, images: int) -> list[Any]:
    """What the manager does for one batch: buffers for (budget, images), the forward once as at
    capture, the batch's values copied in by the config's padding (vLLM's own zero-pad for the
    rest), the buffers' forward again where a GPU replays the graph, then vLLM's scatter of each
    image's tokens from the front of the output."""
    config = model.get_encoder_cudagraph_config()
    buffers = model.prepare_encoder_cudagraph_capture_inputs(
        budget, images, images, CPU, torch.float32
    ).values
    with torch.inference_mode():
        model.encoder_cudagraph_forward({**buffers})
        values = model.prepare_encoder_cudagraph_replay_buffers(kwargs, images, images).values
        for key, buffer in buffers.items():
            pad = config.padding_logics.get(key, EncoderCudaGraphManager._copy_padded_buffer)
            pad(buffer, values[key])
        output = model.encoder_cudagraph_forward({**buffers})
    specs = model.get_encoder_cudagraph_item_specs(kwargs)
    dest: dict[int, Any] = {}
    order = list(range(len(specs)))
    scatter_output_slices(output, order, [s.output_tokens for s in specs], dest, True)
    return [dest[i] for i in order]


def test_the_buffers_forward_gives_the_eager_embeddings_image_by_image(packed: Any) -> None:
    """Three images of 64, 128 and 64 patches (16, 32 and 16 tokens) in the buffers of a
    64-token budget for four images: the fourth image is empty (cu_seqlens repeats its last
    offset) and each image's tokens equal the eager call's, bit for bit."""
    grids = [(1, 8, 8), (1, 8, 16), (1, 4, 16)]
    kwargs = batch(grids)
    with torch.inference_mode():
        eager = packed.embed_multimodal(**batch(grids))
    ours = replayed(packed, kwargs, budget=64, images=4)
    assert [tuple(e.shape) for e in ours] == [tuple(e.shape) for e in eager]
    for graph, plain in zip(ours, eager, strict=True):
        assert torch.equal(graph, plain)


class FakeGraph:
    """A fake CUDA graph (the CPU has none): `replay` runs again what capture ran, the model's
    forward over the same buffers into the same output buffer."""

    def __init__(self, model: Any, values: dict[str, Any], output: Any) -> None:
        self.model, self.values, self.output = model, values, output

    def replay(self) -> None:
        self.output.copy_(self.model.encoder_cudagraph_forward({**self.values}))


class CpuManager(EncoderCudaGraphManager):
    """vLLM's manager with its capture of one budget restated around FakeGraph (its own code:
    the model's capture inputs, one forward, the output buffer); budgets, packing, replay
    buffers, padding, the eager fallback and the scatter stay vLLM's."""

    def _capture_budget_graph(self, token_budget: int, path: str = "default",
                              axis_keys: Any = ()) -> None:  # fmt: skip
        values = self.model.prepare_encoder_cudagraph_capture_inputs(
            token_budget, self.max_batch_size, self.max_frames_per_batch, self.device,
            self.dtype, path, axis_keys,
        ).values  # fmt: skip
        with torch.inference_mode():
            output = torch.empty_like(self.model.encoder_cudagraph_forward({**values}))
        self._get_graph_set(path)[token_budget] = BudgetGraphMetadata(
            token_budget, self.max_batch_size, self.max_frames_per_batch,
            FakeGraph(self.model, values, output), values, output,  # type: ignore[arg-type]
        )  # fmt: skip


def test_vllms_manager_drives_the_class_to_the_eager_embeddings(packed: Any) -> None:
    """vLLM's EncoderCudaGraphManager over the class with budgets of 64 and 128 tokens for up
    to four images: a step of six images is packed by the manager into two full budget batches
    and one image past the largest budget, run eagerly; the buffers filled by the manager, every
    image's embedding in the step's order equals the eager call's, bit for bit."""
    config = VllmConfig(
        model_config=ModelConfig(model=str(tiny_model_dir()), dtype=torch.float32,
                                 max_model_len=4096, skip_tokenizer_init=True, enforce_eager=True),
        compilation_config=CompilationConfig(encoder_cudagraph_token_budgets=[64, 128],
                                             encoder_cudagraph_max_vision_items_per_batch=4),
    )  # fmt: skip
    manager = CpuManager(config, CPU, torch.float32, packed)
    manager.capture(graph_pool=None)
    assert sorted(manager.budget_graphs["default"]) == [64, 128]
    # tokens, packed smallest first: 16 + 16 + 32 + 64 (128, four images: full), 64 (64: full),
    # 144 (past 128: eager); a padded tail is for a GPU (the CPU's SDPA splits by host ints)
    grids = [(1, 16, 16), (1, 8, 8), (1, 24, 24), (1, 8, 16), (1, 4, 16), (1, 8, 32)]
    with torch.inference_mode():
        ours = manager.execute(batch(grids, seed=3))
        eager = packed.embed_multimodal(**batch(grids, seed=3))
    assert (manager.graph_hits, manager.graph_misses) == (5, 1)
    assert [tuple(e.shape) for e in ours] == [tuple(e.shape) for e in eager]
    for graph, plain in zip(ours, eager, strict=True):
        assert torch.equal(graph, plain)


def test_a_batch_past_the_largest_budget_runs_eagerly_to_the_same_tokens(packed: Any) -> None:
    """The manager's eager fallback (`encoder_eager_forward`) returns every image's tokens in one
    tensor, in order: the eager call's, concatenated."""
    grids = [(1, 24, 24), (1, 2, 2), (1, 8, 12)]
    with torch.inference_mode():
        flat = packed.encoder_eager_forward(batch(grids))
        eager = packed.embed_multimodal(**batch(grids))
    assert torch.equal(flat, torch.cat(eager))


def test_items_are_chosen_in_the_managers_order_stacked_or_listed(packed: Any) -> None:
    """`select_encoder_cudagraph_items` keeps the indices' order for a list of images and for
    same-sized images stacked in one tensor; the specs count patches in and tokens out."""
    listed = batch([(1, 8, 8), (1, 4, 16), (1, 2, 2)])
    chosen = packed.select_encoder_cudagraph_items(listed, [2, 0])
    assert chosen["image_grid_thw"].tolist() == [[1, 2, 2], [1, 8, 8]]
    first, second = chosen["pixel_values"]
    assert first is listed["pixel_values"][2]
    assert second is listed["pixel_values"][0]
    stacked = batch([(1, 4, 4)] * 3)
    stacked["pixel_values"] = torch.stack(stacked["pixel_values"])
    picked = packed.select_encoder_cudagraph_items(stacked, [1, 2])
    assert torch.equal(picked["pixel_values"], stacked["pixel_values"][1:])
    specs = packed.get_encoder_cudagraph_item_specs(listed)
    assert [(s.input_size, s.output_tokens) for s in specs] == [(64, 16), (64, 16), (4, 1)]


def test_capture_buffers_have_the_replays_shapes_and_dtypes(packed: Any) -> None:
    """The buffers of a 100-token budget for 8 images hold 8 images of 13 tokens (the budget
    rounded up over the images): 416 patches, pixels in the norm's input dtype, cos/sin in
    float32 at half the head dim, nine offsets, one gather index a patch."""
    values = packed.prepare_encoder_cudagraph_capture_inputs(100, 8, 8, CPU, torch.float32).values
    assert set(values) == set(graphs.BUFFERS)
    vision = packed.config.vision_config
    half = vision.hidden_size // vision.num_attention_heads // 2
    assert tuple(values["pixels"].shape) == (416, 3, 14, 14)
    assert values["pixels"].dtype == (packed.packed_encoder.norm.input_dtype or torch.float32)
    assert tuple(values["positions"].shape) == (416, vision.hidden_size)
    assert (values["cos"].dtype, tuple(values["cos"].shape)) == (torch.float32, (416, half))
    assert values["cu_seqlens"].tolist() == [52 * i for i in range(9)]
    assert sorted(values["merged"].tolist()) == list(range(416))


def test_offsets_are_padded_with_the_last_so_the_missing_images_are_empty() -> None:
    """cu_seqlens [0, 4, 10] into room for four images: [0, 4, 10, 10, 10]."""
    dst = torch.full((5,), -1, dtype=torch.int32)
    graphs.pad_offsets(dst, torch.tensor([0, 4, 10], dtype=torch.int32))
    assert dst.tolist() == [0, 4, 10, 10, 10]


def test_the_budgets_run_from_64_tokens_to_a_steps_encoder_budget() -> None:
    """The smallest budget is MIN_BUDGET; the largest the fewer of the step's token budget and
    the model's length."""
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=16384),
        model_config=SimpleNamespace(max_model_len=8192),
    )
    assert graphs.budget_range(config) == (64, 8192)


def test_graphs_are_opt_in_and_refuse_what_they_cannot_replay(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The class offers encoder graphs, vLLM records them only with cudagraph_mm_encoder (off by
    default), and a set-up a graph cannot replay stops the start with a clear error: the CPU's
    TORCH_SDPA (offsets read on the host), then the plugin's own attention modes."""
    assert supports_encoder_cudagraph(model)
    assert CompilationConfig().cudagraph_mm_encoder is False
    with pytest.raises(ValueError, match=r"varlen ViT attention backend .*TORCH_SDPA"):
        model.get_encoder_cudagraph_config()
    monkeypatch.setattr(graphs, "REPLAYABLE", graphs.REPLAYABLE | {AttentionBackendEnum.TORCH_SDPA})
    assert model.get_encoder_cudagraph_config().buffer_keys == list(graphs.BUFFERS)
    monkeypatch.setattr(model.packed_encoder, "mode", "grouped")
    with pytest.raises(ValueError, match="OCRVL_PLUGIN_VIT_ATTENTION=vllm"):
        model.get_encoder_cudagraph_config()
