"""bench.gpu.floor on the CPU: the project's model config with shrunken sizes, timed for real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("torch", reason=ENGINE_ONLY)

from bench.gpu import floor, layouts  # noqa: E402  (torch first: it lives in the engine venv)

HEY_MPS = Path(__file__).resolve().parents[3] / "bench/results/gpu-h200-2026-12-01-hey-raw/call-b"

SHRUNK = {
    "vision_config": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                      "intermediate_size": 96},
    "text_config": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 192,
                    "vocab_size": 300},
}  # fmt: skip


def shrunk_config(tmp_path: Path) -> Path:
    """The shipped config.json with every size made small and its other keys kept."""
    config = json.loads(floor.CONFIG.read_text())
    for section, sizes in SHRUNK.items():
        config[section] |= sizes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the command line on a 16-visual-token page, 8 output tokens, 4 sequences."""
    tmp = tmp_path_factory.mktemp("floor")
    argv = ["--config", str(shrunk_config(tmp)), "--visual-tokens", "16", "--output-tokens",
            "8", "--batch", "4", "--encoder-batches", "1,2", "--repeat", "3", "--device", "cpu",
            "--out", str(tmp)]  # fmt: skip
    assert floor.main(argv) == 0
    result: dict[str, Any] = json.loads((tmp / "floor.json").read_text())
    return result


def test_the_report_names_the_page_the_shapes_and_the_machine(report: dict[str, Any]) -> None:
    """floor.json records the page asked for, the config's shapes and where it ran."""
    assert report["tool"] == "bench.gpu.floor"
    assert report["page"] == {"visual_tokens": 16, "patches": 64, "prompt_tokens": 26,
                              "output_tokens": 8, "pixels": None}  # fmt: skip
    assert report["shapes"]["v_layers"] == 2
    assert report["shapes"]["t_kv_heads"] == 2
    assert report["shapes"]["patch"] == 14
    assert report["shapes"]["merge"] == 2
    assert report["machine"]["device"] == "cpu"
    assert report["cuda_graphs"] is False
    assert report["decode"]["batch"] == 4
    assert report["decode"]["context"] == 26 + 4  # prompt + half the output


def test_every_stage_took_time(report: dict[str, Any]) -> None:
    """Each encoder batch, the prefill and the decode step have a positive median time."""
    assert [row["pages"] for row in report["encoder"]["per_batch"]] == [1, 2]
    for row in report["encoder"]["per_batch"]:
        assert row["ms_per_call"] > 0
        assert row["ms_per_page"] == pytest.approx(row["ms_per_call"] / row["pages"])
    assert report["prefill_ms_per_page"] > 0
    assert report["decode"]["step_ms"] > 0
    assert report["encoder"]["tflop_per_page"] > 0


def test_the_floor_is_encoder_plus_prefill_plus_a_share_of_the_decode_steps(
    report: dict[str, Any],
) -> None:
    """floor = best encoder ms per page + prefill + decode step x output tokens / batch."""
    encoder = report["encoder"]
    assert encoder["ms_per_page"] == min(row["ms_per_page"] for row in encoder["per_batch"])
    decode = report["decode"]
    assert decode["ms_per_page"] == pytest.approx(decode["step_ms"] * 8 / 4)
    floor_ms = encoder["ms_per_page"] + report["prefill_ms_per_page"] + decode["ms_per_page"]
    assert report["floor_ms_per_page"] == pytest.approx(floor_ms)
    assert report["floor_pages_per_s"] == pytest.approx(1000 / floor_ms)


def test_a_page_read_as_blocks_sums_each_block_s_encoder_and_prefill(tmp_path: Path) -> None:
    """--mix 16,32,16: the page is three blocks, each size timed once; floor = the blocks'
    encoder and prefill summed + decode step x output tokens x 3 / batch; the page's tokens
    are the blocks'."""
    argv = ["--config", str(shrunk_config(tmp_path)), "--mix", "16,32,16", "--output-tokens",
            "4", "--batch", "4", "--encoder-batches", "1,2", "--repeat", "2", "--device", "cpu",
            "--out", str(tmp_path)]  # fmt: skip
    assert floor.main(argv) == 0
    report = json.loads((tmp_path / "floor.json").read_text())
    sizes = {row["visual_tokens"]: row for row in report["mix"]["sizes"]}
    assert sorted(sizes) == [16, 32]
    assert report["mix"]["blocks"] == [16, 32, 16]
    assert report["page"]["visual_tokens"] == 64
    assert report["page"]["output_tokens"] == 12
    encoder = sum(sizes[v]["encoder_ms"] for v in (16, 32, 16))
    prefill = sum(sizes[v]["prefill_ms"] for v in (16, 32, 16))
    assert report["encoder"]["ms_per_page"] == pytest.approx(encoder)
    assert report["prefill_ms_per_page"] == pytest.approx(prefill)
    decode = report["decode"]
    assert decode["ms_per_page"] == pytest.approx(decode["step_ms"] * 4 * 3 / 4)
    assert report["floor_ms_per_page"] == pytest.approx(encoder + prefill + decode["ms_per_page"])


def test_a_page_given_in_pixels_gets_the_model_s_resize() -> None:
    """1240x1754 pixels resize (max 1,003,520 pixels, factor 28) to 840x1176: 30 x 42 tokens."""
    shapes = floor.Shapes.read(floor.CONFIG)
    args = floor.parser().parse_args(["--pixels", "1240x1754", "--output-tokens", "64"])
    page = floor.page_of(shapes, args)
    assert (page.visual_tokens, page.patches, page.prompt_tokens) == (1260, 5040, 1270)
    assert (page.output_tokens, page.pixels) == (64, "1240x1754")


def test_the_encoder_flop_count_matches_the_standard_page() -> None:
    """A 5,120-patch page costs ~7.5 TFLOP in the full-size encoder (../shared/MEASURED.md
    gives 7.47 for the layers; the patch embedding and projector add under 1 %)."""
    tflop = floor.encoder_tflop(floor.Shapes.read(floor.CONFIG), 5120)
    assert 7.47 <= tflop <= 7.47 * 1.01


def test_merged_layouts_state_their_pages_per_s_as_a_fraction_of_the_floor(
    report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seventh H200 pass's MPS call merged beside a floor.json: the floor in the merged
    JSON, each layout's sweep peak and hey pages/s divided by it, and the table saying so."""
    results = tmp_path / "results"
    shutil.copytree(HEY_MPS, results, ignore=shutil.ignore_patterns("*.csv", "*.md"))
    (results / "floor.json").write_text(json.dumps(report))
    monkeypatch.setattr(layouts, "RESULTS", results)
    assert layouts.merge(tmp_path / "out", ["one-mps", "two-mps"], stem="m") == 0
    merged = json.loads((tmp_path / "out" / "m.json").read_text())
    per_s = report["floor_pages_per_s"]
    assert merged["floor"]["floor_pages_per_s"] == per_s
    for row in merged["layouts"]:
        assert row["peak_x_floor"] == pytest.approx(row["peak_pages_per_s"] / per_s)
        assert row["hey_x_floor"] == pytest.approx(row["hey"]["pages_per_s"] / per_s)
        assert row["knee_concurrency"] == 512  # the call's one level
        assert 0 < row["p50_at_knee_s"] <= row["p99_at_knee_s"]
    against = (tmp_path / "out" / "m.md").read_text().split("Against the floor")[1]
    two = next(line for line in against.splitlines() if line.startswith("| two-mps |"))
    cells = [cell.strip() for cell in two.split("|")[1:-1]]
    assert cells[4] == "41.77"  # hey through the gateway, as docs/benchmarks.md quotes it
    hey = next(row["hey"]["pages_per_s"] for row in merged["layouts"] if row["layout"] == "two-mps")
    assert cells[5] == f"{hey / per_s:.0%}"
    assert cells[6] == "1.55"  # hey against one-mps's hey (26.97)


def halves_kernel(x: Any, cos: Any, sin: Any) -> None:
    """The flash-attn rotary's contract in plain torch (a CPU stand-in for the Triton kernel):
    x (batch, n, heads, dim) rotated in place, first half against second, by cos/sin halves."""
    half = x.shape[-1] // 2
    c, s = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    first, second = x[..., :half].clone(), x[..., half:].clone()
    x[..., :half] = first * c - second * s
    x[..., half:] = second * c + first * s


@pytest.mark.parametrize("view", ["encoder", "language model"])
def test_the_fused_rotary_rotates_q_and_k_in_place_as_the_arithmetic_does(view: str) -> None:
    """Through a kernel with the flash-attn contract, `fused` gives the q, k, v `unfused` does,
    for the encoder's (b, n, 3, heads, dim) view and the language model's GQA (b, n, heads, dim)
    one; `none` leaves q and k as projected."""
    import torch  # noqa: PLC0415

    from bench.gpu import floor_model  # noqa: PLC0415

    torch.manual_seed(1)
    n, dim = 12, 8
    cos, sin = floor_model.angles(n, dim, torch.device("cpu"), torch.float32)
    split = [4, 2, 2]
    shape = (2, n, 3, 4, dim) if view == "encoder" else (2, n, sum(split), dim)
    qkv = torch.randn(*shape)
    want = floor_model.rope_for("unfused", cos, sin, None, split)(qkv.clone())
    got = floor_model.rope_for("fused", cos, sin, halves_kernel, split)(qkv.clone())
    for expected, actual in zip(want, got, strict=True):
        assert torch.allclose(expected, actual, atol=1e-5)
    plain = floor_model.rope_for("none", cos, sin, None, split)(qkv.clone())
    assert torch.equal(plain[2], want[2])  # v is never rotated
    assert not torch.allclose(plain[0], want[0])  # q is rotated by the others


def fake_triton_kernel(x: Any, cos: Any, sin: Any) -> None:
    """A fake of vLLM's Triton rotary (`vllm_flash_attn.ops.triton.rotary.apply_rotary`): its
    assertion (`x.dtype == cos.dtype`, rotary.py:177), then the contract in plain torch."""
    assert x.dtype == cos.dtype == sin.dtype, f"x {x.dtype}, cos {cos.dtype}, sin {sin.dtype}"
    halves_kernel(x, cos, sin)


def test_the_fused_line_in_bf16_hands_the_kernel_cos_and_sin_in_q_and_k_s_dtype() -> None:
    """As the floor runs on a GPU (bfloat16 weights and angles): the fused rope and the rotary
    check give the kernel cos/sin in q/k's dtype (pass 9's fused line crashed on the assertion),
    and the fused q/k stay within bf16 rounding of the arithmetic."""
    import torch  # noqa: PLC0415

    from bench.gpu import floor_model  # noqa: PLC0415

    torch.manual_seed(2)
    n, dim, bf16 = 12, 8, torch.bfloat16
    cos, sin = floor_model.angles(n, dim, torch.device("cpu"), bf16)
    qkv = torch.randn(2, n, 3, 4, dim, dtype=bf16)
    want = floor_model.rope_for("unfused", cos, sin, None, [4, 4, 4])(qkv.clone())
    got = floor_model.rope_for("fused", cos, sin, fake_triton_kernel, [4, 4, 4])(qkv.clone())
    for expected, actual in zip(want, got, strict=True):
        assert actual.dtype == bf16
        assert torch.allclose(expected.float(), actual.float(), atol=5e-2)


def test_the_rotary_check_in_bf16_hands_the_kernel_q_and_k_s_dtype(tmp_path: Path) -> None:
    """The check beside the fused line, in bfloat16 as on a GPU, through the asserting fake."""
    import torch  # noqa: PLC0415

    shapes = floor.Shapes.read(shrunk_config(tmp_path))
    page = floor.Page(visual_tokens=4, patches=16, prompt_tokens=14, output_tokens=4)
    errors = floor.rotary_check(shapes, page, torch.device("cpu"), fake_triton_kernel,
                                torch.bfloat16)  # fmt: skip
    assert max(errors.values()) < 2e-2


def test_every_rotary_mode_is_one_floor_line(tmp_path: Path) -> None:
    """`--rotary unfused,fused,none`: one floor-MODE.json each, floor.json the first, each
    naming its mode and kernel; on the CPU `fused` says the arithmetic stood in."""
    argv = ["--config", str(shrunk_config(tmp_path)), "--visual-tokens", "16", "--output-tokens",
            "8", "--batch", "4", "--encoder-batches", "1", "--repeat", "2", "--device", "cpu",
            "--rotary", "unfused,fused,none", "--out", str(tmp_path)]  # fmt: skip
    assert floor.main(argv) == 0
    lines = {mode: json.loads((tmp_path / f"floor-{mode}.json").read_text())
             for mode in ("unfused", "fused", "none")}  # fmt: skip
    assert json.loads((tmp_path / "floor.json").read_text())["rotary"] == "unfused"
    assert {mode: line["rotary"] for mode, line in lines.items()} == {m: m for m in lines}
    assert "CPU" in lines["fused"]["rotary_kernel"]
    assert lines["none"]["rotary_kernel"] == "left out"
    assert "rotary_check" not in lines["fused"]  # no kernel to check on the CPU
    for line in lines.values():
        assert line["floor_ms_per_page"] > 0


def test_an_unknown_rotary_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--rotary names only unfused, fused or none."""
    with pytest.raises(SystemExit):
        floor.main(["--rotary", "fast", "--device", "cpu"])
    assert "--rotary" in capsys.readouterr().err


def test_the_rotary_check_measures_a_kernel_against_the_arithmetic(tmp_path: Path) -> None:
    """The check run beside the fused line on a GPU: a kernel true to the contract is within
    float32 rounding; one that forgets the sine is far off."""
    import torch  # noqa: PLC0415

    shapes = floor.Shapes.read(shrunk_config(tmp_path))
    page = floor.Page(visual_tokens=4, patches=16, prompt_tokens=14, output_tokens=4)
    good = floor.rotary_check(shapes, page, torch.device("cpu"), halves_kernel)
    assert set(good) == {"encoder", "language model"}
    assert max(good.values()) < 1e-5

    def no_sine(x: Any, cos: Any, sin: Any) -> None:
        halves_kernel(x, cos, sin * 0)

    assert min(floor.rotary_check(shapes, page, torch.device("cpu"), no_sine).values()) > 0.1
