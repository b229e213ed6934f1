"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, GQA attention, SwiGLU.

Parameter names follow HF transformers so safetensors checkpoints load by name. Attention
takes an explicit boolean mask (True = may attend); no module here owns a KV cache.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] in float64, with linear or llama3 scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    sc = cfg.rope_scaling
    kind = sc.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(sc["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old_len = float(sc["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Rotary(nn.Module):
    """cos/sin tables computed on the fly from explicit positions (tree nodes sit at start+depth)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg).float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].to(self.inv_freq.dtype) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)                                 # [B, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, T, H, D]; cos/sin: [B, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


class Attention(nn.Module):
    """Projections and SDPA for grouped-query attention; the caller decides where K/V come from."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=cfg.attention_bias and cfg.model_type != "qwen2")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project_q(self, x, cos, sin) -> torch.Tensor:
        q = self.q_proj(x).unflatten(-1, (self.n_heads, self.head_dim))   # [B, T, H, D]
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin)

    def project_kv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_proj(x).unflatten(-1, (self.n_kv, self.head_dim))      # [B, T, Hkv, D]
        v = self.v_proj(x).unflatten(-1, (self.n_kv, self.head_dim))
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        # q: [B, T, H, D]; k, v: [B, S, Hkv, D]; mask: [B, 1, T, S] bool (True = visible)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask, is_causal=causal and mask is None, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).flatten(2))               # [B, T, hidden]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, f, bias=b)
        self.up_proj = nn.Linear(h, f, bias=b)
        self.down_proj = nn.Linear(f, h, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
