"""PaddleOCR-VL's layers in plain torch, at the sizes of a config.json, for bench.gpu.floor.

Random weights, the real shapes: the vision encoder (patch embedding, pre-norm layers with rotary
SDPA attention, the 2x2-merge projector) and the language model (GQA attention, SwiGLU, the LM
head on the last position). Elementwise details (position interpolation, M-RoPE sections) are
simplified to what costs the same.

The rotary embedding is applied one of three ways (`Rotary`, `--rotary` of bench.gpu.floor):
`unfused`, the textbook arithmetic (cat, neg, two muls and an add around each of q and k: the
floor's first line, 24 % of the encoder in its profile); `fused`, one kernel over q and k of a
layer, in place in the projection's output (vLLM's own: the flash-attn Triton rotary that
vLLM's `ApplyRotaryEmb.forward_cuda` calls; torch.compile of the same arithmetic where vLLM is
not importable; on the CPU, which has neither, the eager arithmetic, said so); `none`, left out
(how the hand measurement of 22.7 ms timed it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shapes:
    """The layer sizes the timing needs, read from a PaddleOCR-VL config.json."""

    v_layers: int
    v_hidden: int
    v_heads: int
    v_inter: int
    patch: int
    merge: int
    t_layers: int
    t_hidden: int
    t_heads: int
    t_kv_heads: int
    head_dim: int
    t_inter: int
    vocab: int

    @classmethod
    def read(cls, path: Path) -> Shapes:
        """The shapes of `path`'s vision_config and text_config."""
        config = json.loads(path.read_text())
        v, t = config["vision_config"], config["text_config"]
        return cls(
            v["num_hidden_layers"], v["hidden_size"], v["num_attention_heads"],
            v["intermediate_size"], v.get("patch_size", 14), v.get("spatial_merge_size", 2),
            t["num_hidden_layers"], t["hidden_size"], t["num_attention_heads"],
            t["num_key_value_heads"],
            t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"],
            t["intermediate_size"], t["vocab_size"],
        )  # fmt: skip


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., n, d) rotated by the angles whose cos/sin are (n, d)."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def angles(n: int, dim: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin (n, dim) of rotary positions 0..n-1 (the 2-D and M-RoPE variants cost the same)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


ROTARY = ("unfused", "fused", "none")
# (qkv viewed as (batch, n, q/k/v..., heads, dim)) -> q, k, v as (batch, heads, n, dim)
Rope = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
InPlace = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]


def fused_kernel(device: torch.device) -> tuple[InPlace | None, str]:
    """The one-kernel rotary on `device` (x (batch, n, heads, dim) rotated in place by cos/sin
    halves), and its name; None on the CPU."""
    if device.type != "cuda":
        return None, "none on the CPU: the eager arithmetic stands in"
    try:
        from vllm.vllm_flash_attn.ops.triton.rotary import apply_rotary  # noqa: PLC0415
    except ImportError:

        @torch.compile(dynamic=False)
        def compiled(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> object:
            half = x.shape[-1] // 2
            c, s = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
            first, second = x[..., :half], x[..., half:]
            return x.copy_(torch.cat((first * c - second * s, second * c + first * s), dim=-1))

        return compiled, "torch.compile of the arithmetic (vLLM not importable), in place"

    def triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> object:
        return apply_rotary(x, cos, sin, inplace=True)

    return triton, "vllm.vllm_flash_attn.ops.triton.rotary.apply_rotary (vLLM's own), in place"


def rope_for(
    mode: str, cos: torch.Tensor, sin: torch.Tensor, kernel: InPlace | None, split: list[int]
) -> Rope:
    """How a layer applies its rotary to its projection's output: the encoder's (b, n, 3, heads,
    dim) view, or the language model's (b, n, heads, dim) one whose q, k, v heads `split` gives.
    cos/sin (the model's dtype) are built once here, not in every layer (vLLM's layers recompute
    them); the fused kernel gets their halves in that dtype, q and k's."""
    half = cos.shape[-1] // 2
    # in the model's dtype, q/k's: the Triton kernel asserts x.dtype == cos.dtype
    cos_half, sin_half = cos[:, :half].contiguous(), sin[:, :half].contiguous()

    def parts(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if qkv.dim() == 5:  # (b, n, 3, heads, dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return q, k, v
        q, k, v = qkv.transpose(1, 2).split(split, dim=1)  # (b, n, heads, dim)
        return q, k, v

    def unfused(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = parts(qkv)
        return rotary(q, cos, sin), rotary(k, cos, sin), v

    def fused(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert kernel is not None  # noqa: S101 (only built with one)
        qk = qkv[:, :, :2].flatten(2, 3) if qkv.dim() == 5 else qkv[:, :, : split[0] + split[1]]
        kernel(qk, cos_half, sin_half)
        return parts(qkv)

    if mode == "none":
        return parts
    if mode == "fused" and kernel is not None:
        return fused
    return unfused


class VisionLayer(nn.Module):
    """SigLIP-style pre-norm block: LayerNorm, fused QKV, rotary SDPA, LayerNorm, GELU MLP."""

    def __init__(self, s: Shapes) -> None:
        super().__init__()
        self.heads = s.v_heads
        self.norm1, self.norm2 = nn.LayerNorm(s.v_hidden), nn.LayerNorm(s.v_hidden)
        self.qkv, self.out = (
            nn.Linear(s.v_hidden, 3 * s.v_hidden),
            nn.Linear(s.v_hidden, s.v_hidden),
        )
        self.fc1, self.fc2 = nn.Linear(s.v_hidden, s.v_inter), nn.Linear(s.v_inter, s.v_hidden)

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = rope(self.qkv(self.norm1(x)).view(b, n, 3, self.heads, -1))
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attn.transpose(1, 2).reshape(b, n, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))


class Vision(nn.Module):
    """Patch embedding, the encoder layers, post-norm and the 2x2-merge projector to the LM."""

    def __init__(self, s: Shapes) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * s.patch * s.patch, s.v_hidden)  # the stride-14 conv as a matmul
        self.layers = nn.ModuleList(VisionLayer(s) for _ in range(s.v_layers))
        self.post = nn.LayerNorm(s.v_hidden)
        merged = s.v_hidden * s.merge**2
        self.pre = nn.LayerNorm(s.v_hidden)
        self.proj1, self.proj2 = nn.Linear(merged, merged), nn.Linear(merged, s.t_hidden)
        self.merge = s.merge**2

    def forward(self, patches: torch.Tensor, rope: Rope) -> torch.Tensor:
        x = self.embed(patches)
        for layer in self.layers:
            x = layer(x, rope)
        x = self.pre(self.post(x))
        b, n, h = x.shape
        return self.proj2(F.gelu(self.proj1(x.reshape(b, n // self.merge, h * self.merge))))


class TextLayer(nn.Module):
    """Ernie-style decoder block: RMSNorm, GQA attention with rotary, RMSNorm, SwiGLU."""

    def __init__(self, s: Shapes) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = s.t_heads, s.t_kv_heads, s.head_dim
        self.norm1, self.norm2 = nn.RMSNorm(s.t_hidden), nn.RMSNorm(s.t_hidden)
        self.qkv = nn.Linear(s.t_hidden, (s.t_heads + 2 * s.t_kv_heads) * s.head_dim, bias=False)
        self.out = nn.Linear(s.t_heads * s.head_dim, s.t_hidden, bias=False)
        self.gate_up = nn.Linear(s.t_hidden, 2 * s.t_inter, bias=False)
        self.down = nn.Linear(s.t_inter, s.t_hidden, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rope, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Prefill (no cache: causal over x) or one decode step (x is 1 token; its K/V go in
        the cache's last slot and it attends to the whole cache)."""
        b, n, _ = x.shape
        q, k, v = rope(self.qkv(self.norm1(x)).view(b, n, self.heads + 2 * self.kv_heads, self.dim))
        if cache is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            cache[0][:, :, -1:].copy_(k)
            cache[1][:, :, -1:].copy_(v)
            attn = F.scaled_dot_product_attention(q, cache[0], cache[1], enable_gqa=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, n, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Text(nn.Module):
    """The language model: its layers, final norm and the (untied) LM head."""

    def __init__(self, s: Shapes) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TextLayer(s) for _ in range(s.t_layers))
        self.norm = nn.RMSNorm(s.t_hidden)
        self.head = nn.Linear(s.t_hidden, s.vocab, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rope,
        caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """The next token of each sequence (logits of the last position only, as vLLM)."""
        for number, layer in enumerate(self.layers):
            x = layer(x, rope, caches[number] if caches else None)
        return self.head(self.norm(x[:, -1])).argmax(dim=-1)


def encoder_tflop(s: Shapes, patches: int) -> float:
    """Matmul TFLOP of one page through the encoder and projector (2 per multiply-add)."""
    per_token = s.v_hidden * (4 * s.v_hidden + 2 * s.v_inter)
    attention = 2 * patches * s.v_hidden  # QK^T and PV per query
    merged = s.v_hidden * s.merge**2
    projector = (patches // s.merge**2) * merged * (merged + s.t_hidden)
    layers = s.v_layers * patches * (per_token + attention)
    return 2 * (layers + 3 * s.patch**2 * s.v_hidden * patches + projector) / 1e12
