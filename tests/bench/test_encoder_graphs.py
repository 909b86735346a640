"""bench/encoder_graphs.py: PaddleOCR-VL through vLLM 0.32's encoder CUDA-graph protocol, on CPU.

No graph can be captured without a GPU. The engine tests build the tiny checkpoint's model with
vLLM's offline `LLM` in this process (the plugin's class registered), make the page images'
inputs with vLLM's own processor and batching, and drive the protocol the way
vllm/v1/worker/encoder_cudagraph.py does: capture buffers, a warm-up forward, the replay's values
copied into the same buffers (with the config's padding logic), the forward again on them, the
output sliced per image. They compare with vLLM's own eager `embed_multimodal`.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch
import yaml
from PIL import Image

from tests.conftest import ROOT, tiny_model_dir
from tests.support.pages import document_page

# Importing vLLM (hence bench.encoder_graphs, imported by the `graphs` fixture for this reason)
# and starting its engine in this process warn from torch and vLLM internals.
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
ENGINE = pytest.mark.vllm  # starts an in-process engine (~20 s)

# Pages as rasterised at 150 dpi, portrait, landscape and a narrower one: three different grids
# (the tiny processor resizes them to at most 256 image tokens each).
PAGE_SIZES = [(1240, 1754), (1754, 1240), (900, 1400)]
PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>OCR:"


@dataclass
class Engine:
    """An in-process vLLM engine serving the tiny checkpoint with `PaddleOCRVLGraphs`."""

    llm: Any
    model: Any
    pages: dict[str, Any]  # the three pages batched as the model runner hands them over


def _engine_kwargs() -> dict[str, Any]:
    """vllm_configs/cpu.yaml's settings that shape the model and its inputs, a smaller KV."""
    config = yaml.safe_load((ROOT / "vllm_configs" / "cpu.yaml").read_text())
    return {
        "dtype": config["dtype"],
        "max_model_len": config["max-model-len"],
        "max_num_batched_tokens": config["max-num-batched-tokens"],
        "limit_mm_per_prompt": json.loads(config["limit-mm-per-prompt"]),
        "mm_processor_cache_gb": config["mm-processor-cache-gb"],
        "enforce_eager": config["enforce-eager"],
        "distributed_executor_backend": config["distributed-executor-backend"],
        "enable_prefix_caching": False,
        "max_num_seqs": 4,
        "kv_cache_memory_bytes": 64 * 2**20,
    }


def _pages(llm: Any) -> dict[str, Any]:
    """Three page images through vLLM's processor, batched by vLLM as for one encoder step."""
    from vllm.multimodal import MULTIMODAL_REGISTRY  # noqa: PLC0415
    from vllm.multimodal.utils import group_and_batch_mm_kwargs  # noqa: PLC0415

    processor = MULTIMODAL_REGISTRY.create_processor(llm.llm_engine.model_config)
    items = []
    for seed, (width, height) in enumerate(PAGE_SIZES):
        page = Image.open(io.BytesIO(document_page(seed, width, height))).convert("RGB")
        processed = processor(PROMPT, processor.info.parse_mm_data({"image": [page]}))
        items += [("image", item) for item in processed["mm_kwargs"]["image"] if item is not None]
    (_, _, batch), *rest = group_and_batch_mm_kwargs(items, device="cpu")
    assert not rest, "vLLM split the three pages into several batches"
    return batch


@pytest.fixture(scope="module")
def graphs() -> ModuleType:
    """bench.encoder_graphs, imported under this module's warning filters."""
    return importlib.import_module("bench.encoder_graphs")


@pytest.fixture(scope="module")
def engine(graphs: ModuleType) -> Iterator[Engine]:
    """The engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), plugin registered."""
    from vllm import LLM, ModelRegistry  # noqa: PLC0415

    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        for key, value in {
            "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", graphs.SWITCH: "1",
            "PYTHONPATH": path,  # vLLM inspects a registered class in a subprocess
        }.items():  # fmt: skip
            patch.setenv(key, value)
        patch.setitem(ModelRegistry.models, graphs.ARCHITECTURE,
                      ModelRegistry.models[graphs.ARCHITECTURE])  # fmt: skip
        graphs.register()
        llm = LLM(model=str(tiny_model_dir()), **_engine_kwargs())
        try:
            (model,) = llm.apply_model(lambda model: model)
            yield Engine(llm, model, _pages(llm))
        finally:
            llm.llm_engine.engine_core.shutdown()


def _select(engine: Engine, indices: list[int]) -> dict[str, Any]:
    return engine.model.select_encoder_cudagraph_items(engine.pages, indices)  # type: ignore[no-any-return]


def _stock(engine: Engine, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """vLLM's own PaddleOCR-VL encoder: image by image, eager."""
    with torch.inference_mode():
        return list(engine.model.embed_multimodal(**mm_kwargs))


class _Replayed:
    """Stands in for a captured torch.cuda.CUDAGraph: replaying re-runs the forward on the very
    buffers captured, into the very output buffer, as a graph's kernels would."""

    def __init__(self, model: Any, buffers: dict[str, torch.Tensor], output: torch.Tensor):
        self.model, self.buffers, self.output = model, buffers, output

    def replay(self) -> None:
        self.output.copy_(self.model.encoder_cudagraph_forward({**self.buffers}))


def _captured_manager(engine: Engine) -> Any:
    """vLLM's EncoderCudaGraphManager for the engine's config, every budget 'captured' as
    `_capture_budget_graph` does it (capture inputs, a warm-up forward, the output buffer)."""
    from vllm.v1.worker.encoder_cudagraph import (  # noqa: PLC0415
        BudgetGraphMetadata,
        EncoderCudaGraphManager,
    )

    vllm_config = engine.llm.llm_engine.vllm_config
    device, dtype = torch.device("cpu"), vllm_config.model_config.dtype
    manager = EncoderCudaGraphManager(vllm_config, device, dtype, engine.model)
    graphs = manager._get_graph_set("default")
    with torch.inference_mode():
        for budget in manager.token_budgets:
            buffers = engine.model.prepare_encoder_cudagraph_capture_inputs(
                budget, manager.max_batch_size, manager.max_frames_per_batch, device, dtype
            ).values
            output = engine.model.encoder_cudagraph_forward({**buffers}).clone()
            graphs[budget] = BudgetGraphMetadata(
                token_budget=budget, max_batch_size=manager.max_batch_size,
                max_frames_per_batch=manager.max_frames_per_batch,
                graph=_Replayed(engine.model, buffers, output),  # type: ignore[arg-type]
                input_buffers=buffers, output_buffer=output,
            )  # fmt: skip
    manager.graph_pool = object()  # is_captured()
    return manager


@ENGINE
def test_vllm_builds_the_plugin_class_and_its_budgets(engine: Engine, graphs: ModuleType) -> None:
    """Registered, vLLM builds PaddleOCRVLGraphs; the tiny model's budgets run from an eighth of
    its largest image (256 tokens) to max-num-batched-tokens."""
    from vllm.model_executor.models.interfaces import supports_encoder_cudagraph  # noqa: PLC0415

    vllm_config = engine.llm.llm_engine.vllm_config
    assert engine.model.get_encoder_cudagraph_budget_range(vllm_config) == (256 // 8, 4096)
    assert type(engine.model) is graphs.PaddleOCRVLGraphs
    assert supports_encoder_cudagraph(engine.model)


@ENGINE
@pytest.mark.parametrize("images", [1, 2, 3])
def test_replayed_buffers_give_vllms_eager_embeddings(engine: Engine, images: int) -> None:
    """One budget larger than the images (padding rows present): the forward on the captured
    buffers, refilled for 1, 2 or 3 pages, gives each page vLLM's own eager embeddings."""
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager  # noqa: PLC0415

    model, batch = engine.model, _select(engine, list(range(images)))
    tokens = [spec.output_tokens for spec in model.get_encoder_cudagraph_item_specs(batch)]
    budget, max_batch_size = 1024, 4
    assert sum(tokens) < budget
    config = model.get_encoder_cudagraph_config()
    with torch.inference_mode():
        buffers = model.prepare_encoder_cudagraph_capture_inputs(
            budget, max_batch_size, 0, torch.device("cpu"), torch.float32
        ).values
        model.encoder_cudagraph_forward({**buffers})  # the capture's warm-up
        replay = model.prepare_encoder_cudagraph_replay_buffers(batch, max_batch_size, 0)
        for key, buffer in buffers.items():
            value = replay.values[key]
            if value is None:
                continue
            copy = config.padding_logics.get(key, EncoderCudaGraphManager._copy_padded_buffer)
            buffer.copy_(value) if value.ndim == 0 else copy(buffer, value)
        output = model.encoder_cudagraph_forward({**buffers})
        assert output.shape == (budget, config.out_hidden_size)
        sliced: dict[int, torch.Tensor] = {}
        model.postprocess_encoder_output(
            {"default": output}, list(range(images)), tokens, sliced, clone=True
        )
    stock = _stock(engine, batch)
    for index in range(images):
        torch.testing.assert_close(sliced[index], stock[index], rtol=1e-5, atol=1e-5)


@ENGINE
def test_vllms_manager_replays_batches_in_turn(engine: Engine) -> None:
    """vLLM's own manager (packing, selection, buffer refills, slicing) over budgets 'captured'
    once: three, one and two pages in turn each get vLLM's eager embeddings, all from graphs."""
    manager = _captured_manager(engine)
    for indices in ([0, 1, 2], [2], [1, 0]):
        batch = _select(engine, indices)
        with torch.inference_mode():
            replayed = manager.execute(batch)
        for got, want in zip(replayed, _stock(engine, batch), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (manager.graph_hits, manager.graph_misses) == (6, 0)


@ENGINE
# FakeTensorMode reads .grad of the model's non-leaf weight views while converting them
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_the_captured_forward_reads_no_tensor_data_on_the_host(engine: Engine) -> None:
    """The forward runs on fake tensors, which raise on .item(), .tolist() and data-dependent
    shapes: what a CUDA graph capture would otherwise hit as a host sync (attention itself is
    vLLM's custom op, shape-only here; its max_seqlen is a CPU scalar, see the varlen test)."""
    from torch._subclasses.fake_tensor import (  # noqa: PLC0415
        DataDependentOutputException,
        FakeTensorMode,
    )

    model = engine.model
    buffers = model.prepare_encoder_cudagraph_capture_inputs(
        256, 4, 0, torch.device("cpu"), torch.float32
    ).values
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        inputs = {key: fake.from_tensor(value) for key, value in buffers.items()}
        with torch.inference_mode():
            output = model.encoder_cudagraph_forward(inputs)
        assert output.shape == (256, model.get_encoder_cudagraph_config().out_hidden_size)
        with pytest.raises(DataDependentOutputException):
            inputs["cu_seqlens"][-1].item()  # the mode does catch a host read


@ENGINE
def test_item_specs_and_selection_follow_the_grids(engine: Engine) -> None:
    """Specs are each page's patches and merged tokens; selecting [2, 0] gives those pages in
    that order, and the eager fallback encodes them as vLLM does."""
    model, grids = engine.model, engine.pages["image_grid_thw"].tolist()
    specs = model.get_encoder_cudagraph_item_specs(engine.pages)
    assert [(s.input_size, s.output_tokens) for s in specs] == [
        (t * h * w, t * (h // 2) * (w // 2)) for t, h, w in grids
    ]
    assert len({tuple(g) for g in grids}) == 3  # three different shapes
    chosen = _select(engine, [2, 0])
    assert chosen["image_grid_thw"].tolist() == [grids[2], grids[0]]
    for got, index in zip(chosen["pixel_values"], [2, 0], strict=True):
        assert torch.equal(got, engine.pages["pixel_values"][index])
    with torch.inference_mode():
        eager = model.encoder_eager_forward(chosen)
    stock = _stock(engine, engine.pages)
    torch.testing.assert_close(eager, torch.cat([stock[2], stock[0]]), rtol=0, atol=0)


@ENGINE
def test_varlen_backends_get_empty_padding_sequences(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With flash attention (the GPU's), cu_seqlens has one entry per image slot, padded with
    the last real one (empty sequences), and max_seqlen is a host scalar fixed at capture."""
    model = engine.model
    monkeypatch.setattr(model, "_varlen_attention", lambda: True)
    batch = _select(engine, [0, 1, 2])
    patches = [spec.input_size for spec in model.get_encoder_cudagraph_item_specs(batch)]
    with torch.inference_mode():
        captured = model.prepare_encoder_cudagraph_capture_inputs(
            1024, 5, 0, torch.device("cpu"), torch.float32
        ).values
        replay = model.prepare_encoder_cudagraph_replay_buffers(batch, 5, 0).values
    assert captured["cu_seqlens"].tolist() == [0, 820, 1640, 2460, 3280, 4100]
    assert captured["max_seqlen"].device.type == "cpu"
    # 4 patches per token of the largest image the tiny processor makes (256), under the budget
    assert model.largest_image_tokens == 256
    assert captured["max_seqlen"].item() == 4 * 256
    ends = [sum(patches[: i + 1]) for i in range(3)]
    assert replay["cu_seqlens"].tolist() == [0, *ends, ends[-1], ends[-1]]
    assert replay["max_seqlen"] is None  # the captured bound stays


@pytest.mark.parametrize(
    ("switch", "version", "swapped"),
    [(None, "0.32.0", False), ("0", "0.32.0", False), ("1", "0.33.0", False),
     ("1", "0.32.1", True)],
)  # fmt: skip
def test_register_swaps_the_class_only_when_switched_on_for_vllm_032(
    graphs: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    switch: str | None,
    version: str,
    swapped: bool,
) -> None:
    """register() leaves vLLM's class without OCRVL_ENCODER_GRAPHS=1 and, warning, on another
    vLLM; with both, PaddleOCR-VL resolves to bench.encoder_graphs:PaddleOCRVLGraphs."""
    import vllm  # noqa: PLC0415
    from vllm import ModelRegistry  # noqa: PLC0415

    arch = graphs.ARCHITECTURE
    before = ModelRegistry.models[arch]
    monkeypatch.setitem(ModelRegistry.models, arch, before)
    if switch is None:
        monkeypatch.delenv(graphs.SWITCH, raising=False)
    else:
        monkeypatch.setenv(graphs.SWITCH, switch)
    monkeypatch.setattr(vllm, "__version__", version)
    with caplog.at_level(logging.WARNING, logger=graphs.log.name):
        graphs.register()
    after = ModelRegistry.models[arch]
    if swapped:
        assert (after.module_name, after.class_name) == (  # type: ignore[attr-defined]
            "bench.encoder_graphs",
            "PaddleOCRVLGraphs",
        )
    else:
        assert after is before
    warned = [r.getMessage() for r in caplog.records if r.name == graphs.log.name]
    assert bool(warned) == (switch == "1" and not swapped)
