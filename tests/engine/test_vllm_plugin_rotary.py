"""The plugin's Triton rotary (ocrvl_vllm_plugin/rotary.py), the real kernel run on the CPU by
Triton's interpreter, against vLLM's own fp32 rotary; its arguments; when the plugin uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ENGINE_ONLY

pytestmark = pytest.mark.engine
pytest.importorskip("vllm", reason=ENGINE_ONLY)

with warnings.catch_warnings():  # torch's own DeprecationWarnings (torch.jit) on vLLM's import
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch
    from ocrvl_vllm_plugin import encoder, rotary
    from vllm.model_executor.layers.rotary_embedding.common import ApplyRotaryEmb

# (rows, heads of q and of k, head_dim, dtype, the view's rank): PaddleOCR-VL's head_dim 72 and
# 16 heads, odd row counts that leave a program's block part empty, a tiny head_dim, a 3-D view
CASES = {
    "72-odd-rows": (37, 16, 72, torch.bfloat16, 4),
    "72-two-blocks": (64, 16, 72, torch.bfloat16, 4),
    "72-3d": (45, 16, 72, torch.bfloat16, 3),
    "8-odd-rows": (37, 16, 8, torch.bfloat16, 4),
    "72-float16": (37, 4, 72, torch.float16, 4),
    "72-float32": (37, 4, 72, torch.float32, 4),
}

# The kernel in Triton's interpreter: TRITON_INTERPRET is read when @triton.jit decorates, so
# in a process of its own that imports rotary.py after setting it.
INTERPRETED = """
import sys, torch
from ocrvl_vllm_plugin.rotary import rotate_
cases = torch.load(sys.argv[1])
for qkv, cos, sin, rank in cases.values():
    qk = qkv[:, :, :2].flatten(2, 3)
    rotate_(qk if rank == 4 else qk[0], cos, sin)
torch.save(cases, sys.argv[1])
"""


def case(rows: int, heads: int, dim: int, dtype: torch.dtype, seed: int) -> tuple[Any, ...]:
    """A random packed qkv (1, rows, 3, heads, dim) and fp32 cos/sin of random angles. Row 0's
    first half lands exactly half-way between two bf16 values: x0 * cos - x1 * sin is
    1 + 2**-7 + 2**-8 (to even: up) in even heads, 1 + 2**-8 (to even: down) in odd ones."""
    generator = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(1, rows, 3, heads, dim, generator=generator) * 3).to(dtype)
    angles = torch.rand(rows, dim // 2, generator=generator) * 200
    cos, sin = angles.cos(), angles.sin()
    cos[0], sin[0] = 1.0, 2.0**-8
    qkv[0, 0, :2, 0::2, : dim // 2] = 1 + 2.0**-7
    qkv[0, 0, :2, 1::2, : dim // 2] = 1.0
    qkv[0, 0, :2, :, dim // 2 :] = -1.0
    return qkv, cos, sin


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each case's qkv before, and after the real kernel rotated its q/k view in Triton's
    interpreter (one subprocess for all cases)."""
    before = {}
    for seed, (name, (rows, heads, dim, dtype, rank)) in enumerate(CASES.items()):
        qkv, cos, sin = case(rows, heads, dim, dtype, seed)
        before[name] = (qkv, cos, sin, rank)
    path = tmp_path_factory.mktemp("rotary") / "cases.pt"
    torch.save(before, path)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED, str(path)],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    after = torch.load(Path(path))
    return {name: (before[name], after[name][0]) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_the_kernel_equals_vllms_fp32_rotary_bit_for_bit_in_the_interpreter(
    interpreted: dict[str, Any], name: str
) -> None:
    """The real kernel, run by Triton's interpreter on the strided q/k view of a packed qkv, in
    place, gives exactly vLLM's `ApplyRotaryEmb.forward_static(..., enable_fp32_compute=True)`
    of the same view (row 0's bf16 ties rounded to even, as torch rounds), v left untouched.
    numpy runs the interpreter's fp32 arithmetic without FMAs, as torch's eager CPU ops do; on a
    GPU Triton may contract FMAs, as it does in flash-attn's kernel that vLLM's class runs there:
    that equality is checked against vLLM's class by bench.gpu.encoder_check in the GPU pass."""
    (qkv, cos, sin, _), rotated = interpreted[name]
    want = ApplyRotaryEmb.forward_static(qkv[:, :, :2].flatten(2, 3), cos, sin, True, True)
    got = rotated[:, :, :2].flatten(2, 3)
    assert got.dtype == qkv.dtype
    mismatched = int((got != want).sum())
    assert mismatched == 0, f"{mismatched} of {got.numel()} elements differ"
    assert torch.equal(got, want)
    assert torch.equal(rotated[:, :, 2], qkv[:, :, 2])
    if qkv.dtype == torch.bfloat16:  # the ties, to even: truncation or half-up would miss one
        ties = got[0, 0, :, : qkv.shape[-1] // 2].float()
        assert bool((ties[0::2] == 1 + 2.0**-6).all())
        assert bool((ties[1::2] == 1.0).all())


def valid() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (1, 5, 4, 8) bf16 q/k view and its (5, 4) fp32 cos/sin."""
    qkv = torch.zeros(1, 5, 3, 2, 8, dtype=torch.bfloat16)
    return qkv[:, :, :2].flatten(2, 3), torch.ones(5, 4), torch.zeros(5, 4)


BAD = {
    "bf16 cos": (lambda qk, c, s: (qk, c.bfloat16(), s), "cos must be float32"),
    "bf16 sin": (lambda qk, c, s: (qk, c, s.bfloat16()), "sin must be float32"),
    "cos rows": (lambda qk, c, s: (qk, c[:4], s), r"cos must be contiguous \(5, 4\)"),
    "sin width": (lambda qk, c, s: (qk, c, torch.zeros(5, 8)), r"sin must be contiguous \(5, 4\)"),
    "strided cos": (lambda qk, c, s: (qk, torch.ones(4, 5).t(), s), "cos must be contiguous"),
    "odd head dim": (lambda qk, c, s: (qk[..., :7], torch.ones(5, 3), s), "must be even"),
    "strided head dim": (lambda qk, c, s: (qk[..., ::2], c[:, :2], s[:, :2]), "stride 1"),
    "batch of 2": (lambda qk, c, s: (torch.cat([qk, qk]), c, s), r"\(1, L, heads, D\)"),
    "2-D": (lambda qk, c, s: (qk[0, 0], c, s), r"\(L, heads, D\)"),
    "int8 qk": (lambda qk, c, s: (qk.to(torch.int8), c, s), "bfloat16, float16 or float32"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_arguments_are_refused_before_the_kernel_runs(name: str) -> None:
    """Wrong dtypes, shapes or strides raise a ValueError that names what was expected, before
    any launch, and leave qk as it was."""
    change, message = BAD[name]
    qk, cos, sin = change(*valid())
    before = qk.clone()
    with pytest.raises(ValueError, match=message):
        rotary.rotate_(qk, cos, sin)
    assert torch.equal(qk, before)


@pytest.mark.parametrize(
    ("flag", "cuda", "chosen"),
    [(None, True, True), ("1", True, True), ("0", True, False), (None, False, False),
     ("1", False, False)],
)  # fmt: skip
def test_the_kernel_runs_on_cuda_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch, flag: str | None, cuda: bool, chosen: bool
) -> None:
    """On CUDA the plugin's kernel is the default; OCRVL_PLUGIN_FUSED_ROTARY=0 turns it off, and
    off CUDA vLLM's rotary (None) runs whatever the flag says."""
    if flag is None:
        monkeypatch.delenv("OCRVL_PLUGIN_FUSED_ROTARY", raising=False)
    else:
        monkeypatch.setenv("OCRVL_PLUGIN_FUSED_ROTARY", flag)
    monkeypatch.setattr(encoder.current_platform, "is_cuda", lambda: cuda)
    assert (encoder.fused_rotary() is rotary.rotate_) is chosen
