"""PaddleOCR-VL's layers in plain torch, at the sizes of a config.json, for bench.gpu.floor.

Random weights, the real shapes: the vision encoder (patch embedding, pre-norm layers with rotary
SDPA attention, the 2x2-merge projector) and the language model (GQA attention, SwiGLU, the LM
head on the last position). Elementwise details (position interpolation, M-RoPE sections) are
simplified to what costs the same, and the rotary embedding is left out (issue 50's floor: a
fused rotary costs next to nothing beside attention; an unfused one is the serving stack's cost,
not the model's).
"""

from __future__ import annotations

import json
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


def heads(x: torch.Tensor, split: list[int] | None = None) -> tuple[torch.Tensor, ...]:
    """q, k, v as (b, heads, n, dim) from the encoder's (b, n, 3, heads, dim) projection, or the
    language model's (b, n, heads, dim) one whose q, k, v heads `split` gives."""
    if split is None:
        q, k, v = x.permute(2, 0, 3, 1, 4)
        return q, k, v
    q, k, v = x.transpose(1, 2).split(split, dim=1)
    return q, k, v


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = heads(self.qkv(self.norm1(x)).view(b, n, 3, self.heads, -1))
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

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = self.embed(patches)
        for layer in self.layers:
            x = layer(x)
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
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Prefill (no cache: causal over x) or one decode step (x is 1 token; its K/V go in
        the cache's last slot and it attends to the whole cache)."""
        b, n, _ = x.shape
        split = [self.heads, self.kv_heads, self.kv_heads]
        q, k, v = heads(self.qkv(self.norm1(x)).view(b, n, sum(split), self.dim), split)
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
        self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> torch.Tensor:
        """The next token of each sequence (logits of the last position only, as vLLM)."""
        for number, layer in enumerate(self.layers):
            x = layer(x, caches[number] if caches else None)
        return self.head(self.norm(x[:, -1])).argmax(dim=-1)


def encoder_tflop(s: Shapes, patches: int) -> float:
    """Matmul TFLOP of one page through the encoder and projector (2 per multiply-add)."""
    per_token = s.v_hidden * (4 * s.v_hidden + 2 * s.v_inter)
    attention = 2 * patches * s.v_hidden  # QK^T and PV per query
    merged = s.v_hidden * s.merge**2
    projector = (patches // s.merge**2) * merged * (merged + s.t_hidden)
    layers = s.v_layers * patches * (per_token + attention)
    return 2 * (layers + 3 * s.patch**2 * s.v_hidden * patches + projector) / 1e12
