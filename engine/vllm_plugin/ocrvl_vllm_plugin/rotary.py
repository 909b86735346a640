"""The vision tower's rotary as one in-place Triton kernel: vLLM's fp32 rotary without its copies.

vLLM's `ApplyRotaryEmb(enable_fp32_compute=True)` copies q/k to fp32, rotates out of place and
casts back (four kernels a layer on CUDA). `rotate_` reads the bf16 q/k view of the packed qkv
projection, computes in fp32 with fp32 cos/sin (neox halves, the expression order of
flash-attn's Triton rotary, which vLLM's class runs on CUDA) and writes the result back rounded
to nearest even, as torch's `.to(bfloat16)` rounds: the same numbers, one kernel.

The bf16 rounding is done on the bits rather than by Triton's cast because Triton's CPU
interpreter (TRITON_INTERPRET=1, which the tests run) truncates fp32 to bf16, rtne asked or not
(triton 3.9); on the bits, the GPU and the interpreter run the same rounding. Imported only where
triton is (encoder.py's `fused_rotary` guards the import).
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]

# One program rotates 32 rows of one head: for head_dim 72, 32 x 36 pairs on four warps (a tile
# of 32 x 64, the half-dims padded to a power of two), ~450 x 32 programs for a page of 14,400
# patches. Not tuned yet: the next GPU pass measures the kernel against vLLM's four.
BLOCK_ROWS = 32
WARPS = 4

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _rounded_to_bf16(x):  # type: ignore[no-untyped-def]
    """fp32 to bf16, round to nearest even (NaN to 0x7FC0), as c10's BFloat16 rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded)  # NaN
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit  # type: ignore[untyped-decorator]
def _rotate_kernel(  # type: ignore[no-untyped-def]  # noqa: PLR0917 (a kernel's signature)
    qk,
    cos,
    sin,
    rows,
    row_stride,
    HEAD_STRIDE: tl.constexpr,  # a model's constant: the compiler sees the heads' alignment
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BF16: tl.constexpr,
):
    """One program: BLOCK_R rows of one head, both halves of its head_dim."""
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    dim = tl.arange(0, BLOCK_D)
    inside = (row[:, None] < rows) & (dim[None, :] < HALF)
    angle = row[:, None] * HALF + dim[None, :]
    c = tl.load(cos + angle, mask=inside, other=0.0)
    s = tl.load(sin + angle, mask=inside, other=0.0)
    # int64 offsets: a packed call of many pages passes 2**31 elements of qkv
    first = qk + row[:, None].to(tl.int64) * row_stride + tl.program_id(1) * HEAD_STRIDE
    first = first + dim[None, :]
    x0 = tl.load(first, mask=inside, other=0.0).to(tl.float32)
    x1 = tl.load(first + HALF, mask=inside, other=0.0).to(tl.float32)
    o0 = x0 * c - x1 * s
    o1 = x0 * s + x1 * c
    if BF16:
        tl.store(first, _rounded_to_bf16(o0), mask=inside)
        tl.store(first + HALF, _rounded_to_bf16(o1), mask=inside)
    else:
        tl.store(first, o0.to(qk.dtype.element_ty), mask=inside)
        tl.store(first + HALF, o1.to(qk.dtype.element_ty), mask=inside)


def rotate_(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate qk, (1, L, heads, D) or (L, heads, D) with unit stride on D, in place by cos/sin,
    (L, D / 2) fp32 and contiguous: vLLM's fp32 neox rotary, rounded once to qk's dtype."""
    if qk.dim() == 4:
        if qk.shape[0] != 1:
            raise ValueError(f"qk must be (1, L, heads, D) or (L, heads, D); got {tuple(qk.shape)}")
        qk = qk[0]
    if qk.dim() != 3:
        raise ValueError(f"qk must be (1, L, heads, D) or (L, heads, D); got {tuple(qk.shape)}")
    rows, heads, dim = qk.shape
    if qk.dtype not in DTYPES:
        raise ValueError(f"qk must be bfloat16, float16 or float32; got {qk.dtype}")
    if dim % 2 or qk.stride(-1) != 1:
        raise ValueError(f"qk's head dim must be even with stride 1; got {dim}, {qk.stride()}")
    half = dim // 2
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the fp32 rotary); got {table.dtype}")
        if tuple(table.shape) != (rows, half) or not table.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous ({rows}, {half}) for qk {tuple(qk.shape)}; "
                f"got {tuple(table.shape)}, strides {table.stride()}"
            )
        if table.device != qk.device:
            raise ValueError(f"{name} is on {table.device}, qk on {qk.device}")
    if rows == 0 or heads == 0:
        return
    grid = (triton.cdiv(rows, BLOCK_ROWS), heads)
    _rotate_kernel[grid](
        qk, cos, sin, rows, qk.stride(0), HEAD_STRIDE=qk.stride(1), HALF=half,
        BLOCK_R=BLOCK_ROWS, BLOCK_D=triton.next_power_of_2(half),
        BF16=qk.dtype == torch.bfloat16, num_warps=WARPS,
    )  # fmt: skip
