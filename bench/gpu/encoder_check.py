"""vLLM's own PaddleOCR-VL vision encoder against the packed one of engine/vllm_plugin.

    python -m bench.gpu.encoder_check [--batches 1,2,4,8,16,32,64] [--repeat 5] [--out FILE]
    python -m bench.gpu.encoder_check --device cpu --tiny DIR    # CI: the tiny checkpoint
    python -m bench.gpu.encoder_check --kinds pages,blocks --attention vllm,sdpa,cudnn,grouped
        [--stock-backend B] [--backends TRITON_ATTN,TORCH_SDPA]    # issue 50: ViT attention

On the H200 host, after `python3 -m bench.gpu.run PLAN install` (vLLM 0.32 and the plugin in
/tmp/site032): `. bench/gpu/host/env.sh && python3 -m bench.gpu.encoder_check --out FILE`.

Both classes are built by vLLM (its ModelConfig, its parallel state for one process) from one
checkpoint, with the same weights loaded: by default the full-size random-weight checkpoint that
`python3 -m bench.gpu.run PLAN prepare` builds ($GPU_BENCH_DIR/paddleocr-vl-full, from
app/profiles/data/paddleocr-vl-1.5's shapes; built here the same way if missing) in bfloat16,
with `--tiny DIR` the tiny test checkpoint in float32. Each batch mixes images as a document
parse sends them (`batch_grids`: whole pages, blocks at PaddleX's min_pixels 112,896, blocks of
other sizes; `--kinds pages` or `blocks`: only those), resized by vLLM's own smart_resize;
random pixels. Each of `--attention`'s modes (the plugin's OCRVL_PLUGIN_VIT_ATTENTION, its
attention.py) is checked and timed on every batch; `--stock-backend` builds vLLM's own class with
that `--mm-encoder-attn-backend` for the stock line (default: vLLM's pick, flash-attn on an H200),
and each of `--backends` builds one more of vLLM's classes with that backend, checked against the
stock line and timed beside it (`backends` per batch: vLLM's own ViT attention backends).

Per batch: the largest difference between the two classes' embeddings (absolute, and relative
to the stock's largest magnitude) and each class's encoder time (`embed_multimodal`, the call the
engine makes; CUDA events after warm-up on a GPU, the wall clock on the CPU). In bfloat16 the
bound is bfloat16's own rounding: twice the stock's distance from a float32 copy of itself (each
bf16 run may be that far from float32, so the two from each other twice that); float32 is held
to REL_FP32. Prints a table, writes the JSON to --out; exit 1 if any batch is out of bounds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from bench.gpu import WORK, floor
from bench.gpu.floor_timing import timed

FULL_DIR = WORK / "paddleocr-vl-full"  # the full-size checkpoint `prepare` builds

ROOT = Path(__file__).resolve().parents[2]
MIN_PIXELS, MAX_PIXELS = 112_896, 1_003_520  # PaddleX's (and PaddleOCR's client's) limits
PAGE = (1654, 2339)  # an A4 page at 200 dpi, resized to max_pixels
REL_FP32 = 1e-4


def parallel_state(vllm_config: Any, device: torch.device) -> None:
    """vLLM's distributed state for one process (once per process), as its tests set it up."""
    from vllm.config import set_current_vllm_config  # noqa: PLC0415
    from vllm.distributed import parallel_state as state  # noqa: PLC0415

    if state.model_parallel_is_initialized():
        return
    with set_current_vllm_config(vllm_config):
        state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0,
            distributed_init_method=f"file://{tempfile.mkstemp(prefix='ocrvl-dist-')[1]}",
            backend="nccl" if device.type == "cuda" else "gloo",
        )  # fmt: skip
        state.initialize_model_parallel(1, 1)


def build(
    model_dir: Path, cls: type, device: torch.device, dtype: torch.dtype, backend: str | None = None
) -> Any:
    """`cls` (vLLM's PaddleOCR-VL class or a subclass) as vLLM builds it, weights loaded, taking
    normalised pixels (mm_device_do_normalize off); its ViT attention `backend` as
    `--mm-encoder-attn-backend` names it (None: vLLM's pick)."""
    from safetensors.torch import load_file  # noqa: PLC0415
    from vllm.config import ModelConfig, VllmConfig  # noqa: PLC0415
    from vllm.model_executor.model_loader.utils import (  # noqa: PLC0415
        initialize_model,
        process_weights_after_loading,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: PLC0415

    model_config = ModelConfig(
        model=str(model_dir), dtype=dtype, max_model_len=4096, skip_tokenizer_init=True,
        enforce_eager=True, mm_encoder_attn_backend=backend, mm_device_do_normalize=False,
    )  # fmt: skip
    vllm_config = VllmConfig(model_config=model_config)
    parallel_state(vllm_config, device)
    with set_default_torch_dtype(dtype), torch.device(device):
        model = initialize_model(vllm_config, model_class=cls)
        for shard in sorted(model_dir.glob("*.safetensors")):
            model.load_weights(load_file(shard).items())
        # what vLLM's loader does next (on the CPU: picks each linear layer's GEMM)
        process_weights_after_loading(model, model_config, device)
    return model.eval()


def pair(
    model_dir: Path, device: torch.device, dtype: torch.dtype, backend: str | None = None
) -> tuple[Any, Any]:
    """vLLM's own class (ViT attention `backend`) and the plugin's, from the same checkpoint."""
    from ocrvl_vllm_plugin.model import PackedPaddleOCRVLForConditionalGeneration  # noqa: PLC0415
    from vllm.model_executor.models.paddleocr_vl import (  # noqa: PLC0415
        PaddleOCRVLForConditionalGeneration,
    )

    return (
        build(model_dir, PaddleOCRVLForConditionalGeneration, device, dtype, backend),
        build(model_dir, PackedPaddleOCRVLForConditionalGeneration, device, dtype),
    )


def grid_of(width: int, height: int) -> tuple[int, int, int]:
    """(t, h, w) in patches of an image of width x height, resized as vLLM resizes it."""
    from vllm.model_executor.models.paddleocr_vl import smart_resize  # noqa: PLC0415

    h, w = smart_resize(height, width, factor=28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return (1, h // 14, w // 14)


def batch_grids(images: int, rng: random.Random, kind: str = "mixed") -> list[tuple[int, int, int]]:
    """`images` grids as a document parse sends them: a page in six, a block at min_pixels in
    three, the rest blocks of random size and shape (a line of text to a table), shuffled;
    `pages`: whole pages only; `blocks`: blocks only, a third of them at min_pixels."""
    grids = []
    for i in range(images):
        if kind == "pages" or (kind == "mixed" and i % 6 == 0):
            grids.append(grid_of(*PAGE))
        elif i % 3 == 0:
            grids.append(grid_of(336, 336))  # 336 x 336 = min_pixels
        else:
            grids.append(grid_of(rng.randint(60, 1600), rng.randint(30, 900)))
    rng.shuffle(grids)
    return grids


def inputs(grids: list[tuple[int, int, int]], device: torch.device, seed: int) -> dict[str, Any]:
    """embed_multimodal's keyword arguments for `grids`: random normalised pixels per image (a
    list, as vLLM batches images of different sizes) and the grids (kept on the host)."""
    generator = torch.Generator().manual_seed(seed)
    pixels = [
        (torch.rand(t * h * w, 3, 14, 14, generator=generator) * 2 - 1).to(device)
        for t, h, w in grids
    ]
    return {"pixel_values": pixels, "image_grid_thw": torch.tensor(grids, dtype=torch.int64)}


def distance(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Largest absolute difference over every image, and that over the largest |theirs|."""
    shapes = [(a.shape, b.shape) for a, b in zip(ours, theirs, strict=True)]
    if any(a != b for a, b in shapes):
        raise AssertionError(f"the classes' embeddings differ in shape: {shapes}")
    diff = max(
        float((a.float() - b.float()).abs().max()) for a, b in zip(ours, theirs, strict=True)
    )
    scale = max(float(b.float().abs().max()) for b in theirs)
    return {"max_abs": diff, "max_rel": diff / scale if scale else diff}


def check_batch(
    models: dict[str, Any], grids: list[tuple[int, int, int]], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    """One batch: the plugin's distance from the stock, its bound, and both classes' times;
    under `modes`, the same for each ViT attention mode of the plugin."""
    from ocrvl_vllm_plugin import attention  # noqa: PLC0415 (beside vLLM, on demand)

    kwargs = inputs(grids, args.device, seed)
    with torch.inference_mode():
        stock = models["stock"].embed_multimodal(**kwargs)
        packed = models["plugin"].embed_multimodal(**kwargs)
        row: dict[str, Any] = {
            "images": len(grids),
            "patches": sum(t * h * w for t, h, w in grids),
            "tokens": sum(e.shape[0] for e in stock),
            "grids": [list(g) for g in grids],
        } | distance(packed, stock)
        if "reference" in models:  # bf16: how far bf16 rounding alone moves the stock
            reference = models["reference"].embed_multimodal(**kwargs)
            row["stock_vs_fp32_rel"] = distance(stock, reference)["max_rel"]
            row["bound_rel"] = 2 * row["stock_vs_fp32_rel"]
        else:
            row["bound_rel"] = REL_FP32
        row["within"] = row["max_rel"] <= row["bound_rel"]
        for name in ("stock", "plugin"):
            model = models[name]
            row[f"{name}_ms"] = timed(
                lambda m=model: m.embed_multimodal(**kwargs), args.device, False, args.repeat
            )

        def line(model: Any) -> dict[str, Any]:
            """`model`'s distance from the stock, within the bound or not, its time."""
            got = distance(model.embed_multimodal(**kwargs), stock)
            ms = timed(lambda: model.embed_multimodal(**kwargs), args.device, False, args.repeat)
            return got | {"within": got["max_rel"] <= row["bound_rel"], "ms": ms,
                          "speedup": row["stock_ms"] / ms}  # fmt: skip

        encoder, modes = models["plugin"].packed_encoder, {}
        default = encoder.attend
        for mode in args.attention:
            encoder.attend = attention.for_mode(mode)
            modes[mode] = line(models["plugin"])
        encoder.attend = default
        backends = {name: line(model) for name, model in models.get("backends", {}).items()}
    row["speedup"] = row["stock_ms"] / row["plugin_ms"]
    row["modes"], row["backends"] = modes, backends
    row["within"] = row["within"] and all(
        m["within"] for m in (*modes.values(), *backends.values())
    )
    return row


def table(report: dict[str, Any]) -> str:
    """The per-batch lines of the report, for the terminal."""
    lines = [
        f"encoder check: {report['model']['kind']} checkpoint, {report['dtype']}, "
        f"{report['machine']['device']}, ViT attention {report['attention']}, fused rotary "
        f"{report['fused_rotary']}",
        f"{'images':>6} {'patches':>8} {'max abs':>10} {'max rel':>10} {'bound':>10} "
        f"{'stock ms':>9} {'plugin ms':>9} {'speedup':>7}",
    ]
    for row in report["batches"]:
        lines_of = row["modes"] | row.get("backends", {})
        modes = "  ".join(f"{name} {m['ms']:.2f} ms{'' if m['within'] else ' !'}"
                          for name, m in lines_of.items())  # fmt: skip
        lines.append(
            f"{row['images']:>6} {row['patches']:>8} {row['max_abs']:>10.3g} "
            f"{row['max_rel']:>10.3g} {row['bound_rel']:>10.3g} {row['stock_ms']:>9.2f} "
            f"{row['plugin_ms']:>9.2f} {row['speedup']:>6.2f}x"
            + ("" if row["within"] else " !")
            + (f"  [{row['kind']}] {modes}" if modes else "")
        )
    verdict = "all within bounds" if report["within"] else "OUT OF BOUNDS (!)"
    return "\n".join([*lines, verdict])


def parser() -> argparse.ArgumentParser:
    """The command line's options."""
    options = argparse.ArgumentParser(prog="python -m bench.gpu.encoder_check")
    options.add_argument("--tiny", type=Path, help="the tiny checkpoint's folder (float32)")
    options.add_argument("--device", default="cuda", help="cuda (the H200) or cpu")
    options.add_argument("--batches", default="1,2,4,8,16,32,64", help="images per batch")
    options.add_argument("--repeat", type=int, default=5, help="timed calls per class and batch")
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--kinds", default="mixed", help="mixed, pages, blocks (a,b: each)")
    options.add_argument("--attention", default="", help="the plugin's modes to check and time")
    options.add_argument("--stock-backend", help="vLLM's --mm-encoder-attn-backend for stock")
    options.add_argument("--backends", default="", help="more of vLLM's ViT backends to time")
    options.add_argument("--out", type=Path, default=Path("encoder-check.json"))
    return options


def checkpoint(args: argparse.Namespace) -> tuple[Path, torch.dtype, str]:
    """The checkpoint to build both classes from (made if missing), its dtype and its kind."""
    model_dir, flag, dtype, kind = FULL_DIR, ["--full"], torch.bfloat16, "full"
    if args.tiny is not None:
        model_dir, flag, dtype, kind = args.tiny, [], torch.float32, "tiny"
    if not (model_dir / "config.json").exists():  # as `bench.gpu.run PLAN prepare` builds it
        import subprocess  # noqa: PLC0415

        command = [sys.executable, "-m", "tests.support.tiny_model", str(model_dir), *flag]
        subprocess.run(command, check=True, cwd=ROOT)
    return model_dir, dtype, kind


def main(argv: list[str] | None = None) -> int:
    """The command line: build both classes, check every batch, print, write the JSON."""
    args = parser().parse_args(argv)
    args.device = torch.device(args.device)
    args.attention = [mode for mode in args.attention.split(",") if mode]
    model_dir, dtype, kind = checkpoint(args)
    built = pair(model_dir, args.device, dtype, args.stock_backend)
    models: dict[str, Any] = dict(zip(("stock", "plugin"), built, strict=True))
    stock_class = type(models["stock"])
    models["backends"], refused = {}, {}
    for name in filter(None, args.backends.split(",")):
        try:  # a backend this vLLM or GPU refuses is reported, not fatal
            models["backends"][name] = build(model_dir, stock_class, args.device, dtype, name)
        except Exception as exc:
            refused[name] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"backend {name} refused: {refused[name]}", flush=True)
    if dtype != torch.float32:
        models["reference"] = build(model_dir, stock_class, args.device, torch.float32)
    rng = random.Random(args.seed)  # noqa: S311 (a seeded choice of image sizes)
    batches = [
        check_batch(models, batch_grids(int(n), rng, kinds), args, args.seed + i) | {"kind": kinds}
        for kinds in args.kinds.split(",")
        for i, n in enumerate(args.batches.split(","))
    ]
    vision = models["plugin"].config.vision_config
    report = {
        "tool": "bench.gpu.encoder_check",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.gpu.encoder_check " + " ".join(argv or sys.argv[1:]),
        "model": {"dir": str(model_dir), "kind": kind, "vision_layers": vision.num_hidden_layers,
                  "vision_hidden": vision.hidden_size, "vision_heads": vision.num_attention_heads},
        "dtype": str(dtype).removeprefix("torch."),
        "machine": floor.machine(args.device),
        "attention": models["plugin"].visual.vision_model.encoder.attn_backend.name,
        "stock_attention": models["stock"].visual.vision_model.encoder.attn_backend.name,
        "fused_rotary": models["plugin"].packed_encoder.rotate is not None,
        "backends_refused": refused,
        "batches": batches,
        "within": all(row["within"] for row in batches),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    return 0 if report["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
