"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, GQA attention, SwiGLU.

Parameter names follow HF transformers so safetensors checkpoints load by name; `fuse()` then
merges q/k/v and gate/up into one GEMM each for inference (training keeps the HF layout), and
`pack_projections()` gives each projection its weight in the CPU kernel's layout (`cpu_dense`).
Attention takes an explicit boolean mask (True = may attend) or none (all keys visible); no
module here owns a KV cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from . import cpu_dense, quant


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
          packed: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias; x [..., in], weight [out, in] -> [..., out].

    With `packed` (the weight in `cpu_dense`'s panels, made by `Linear.pack` for the model runner)
    and a CPU input of the packed dtype (float32 or bfloat16): the CPU kernel (`cpu_dense.cpp`),
    eager or compiled — ~3-5x faster than MKL (float32) or oneDNN (bfloat16) for the rows a decode
    step multiplies on the reference CPUs, and batch-invariant.
    Without it, one row on a CPU inside a compiled graph is written as a multiply-and-sum, which
    inductor turns into one vectorised reduction streaming each weight once (~3x faster than
    MKL's GEMV there; more rows stay one GEMM: the sum costs a weight pass per row). Everything
    else (CUDA, training, other dtypes) is `F.linear`. The forms differ only in rounding.
    """
    if x.dtype != weight.dtype and not x.requires_grad:
        # float32 activations against a weight stored in bf16 (a blocks target's float projections,
        # `loader.resolve_dtypes`): the product in the weight's dtype, the bias added in float32
        y = dense(x.to(weight.dtype), weight, None, packed).to(x.dtype)
        return y if bias is None else y + bias.to(x.dtype)
    if packed is not None and x.device.type == "cpu" and x.dtype == packed.dtype and not x.requires_grad:
        return cpu_dense.dense(x, weight, packed, bias)
    if torch.compiler.is_compiling() and x.device.type == "cpu" and math.prod(x.shape[:-1]) == 1:
        # (math.prod keeps symbolic sizes symbolic; torch.Size.numel() would make export specialise them)
        y = (x.reshape(1, -1) * weight).sum(-1)                            # [out]
        y = y if bias is None else y + bias
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def _kernel_applies(t: torch.Tensor) -> bool:
    """The CPU projection kernel serves float32 and bfloat16 CPU tensors, where it builds."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.bfloat16) and cpu_dense.available()


def _packed_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight packed for the CPU kernel, or None where the kernel does not apply."""
    return cpu_dense.pack(weight) if _kernel_applies(weight) else None


class Linear(nn.Linear):
    """nn.Linear (same parameters and state-dict names) whose forward is `dense`.

    `pack()` adds the weight in the CPU kernel's layout (a buffer outside the state dict, made once
    at load: the weight must not change afterwards); until then, and where the kernel does not
    apply, it is F.linear.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("packed", None, persistent=False)

    def pack(self) -> None:
        self.packed = _packed_for_cpu(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense(x, self.weight, self.bias, self.packed)


def pack_projections(model: nn.Module) -> bool:
    """Pack every projection of `model` for the CPU kernel (inference only: weights frozen from
    here on). False, changing nothing, where the kernel does not apply (not a float32/bf16 CPU model,
    no AVX2, no compiler, FLASHTREE_CPU_KERNEL=0)."""
    p = next(model.parameters(), None)
    if p is None or not _kernel_applies(p):
        return False
    for m in model.modules():
        if isinstance(m, (Linear, Attention)):
            m.pack()
    return True


def _fused(parts) -> Linear | quant.QuantLinear | None:
    """The projections' rows one after another as one projection (inference only): a Linear of
    Linears, a QuantLinear of blocks of one kind; None for any other mix (left unfused)."""
    bias = None if parts[0].bias is None else torch.cat([p.bias.detach() for p in parts])
    if all(isinstance(p, quant.QuantLinear) for p in parts):
        blocks = quant.cat([p.form for p in parts])
        return None if blocks is None else quant.QuantLinear(blocks, bias)
    if not all(isinstance(p, Linear) for p in parts):
        return None
    w = parts[0].weight
    fused = Linear(w.shape[1], sum(p.out_features for p in parts), bias=bias is not None)
    fused = fused.to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if bias is not None:
            fused.bias.copy_(bias)
    return fused.requires_grad_(False)


class Embedding(nn.Embedding):
    """nn.Embedding (same parameter) whose initialisation skips a weight on the meta device: the
    loader builds models there and then loads every weight, and `normal_` on meta runs through
    torch's reference ops, which import dynamo and triton for nothing (~1 s, ~65 MB resident)."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32:  # one fused op: x * rsqrt(mean(x^2) + eps) * weight
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x = x.float()  # half precision: normalise in fp32, scale in the input dtype (as HF)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] in float64, with linear or llama3 scaling applied; on the CPU
    whatever the default device (on meta, where the loader builds models, arange runs through
    torch's reference ops, which import dynamo and triton)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
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
        self.register_buffer("inv_freq", rope_inv_freq(cfg).float().to(torch.get_default_device()), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].to(self.inv_freq.dtype) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)                                 # [B, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, T, H, D]; cos/sin: [B, T, D]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def page_rows(table: torch.Tensor, cols: torch.Tensor, page_size: int) -> torch.Tensor:
    # logical cache row c of sequence b lives at physical row table[b, c // P] * P + c % P
    # table [B, pages]; cols [S] = arange(S) -> [B, S]
    return table[:, cols // page_size] * page_size + cols % page_size


@dataclass(slots=True)
class Paged:
    """One layer's view of a paged KV cache for `Attention.attend_paged`: cache [rows, Hkv, D];
    table [B, pages]; lengths [B] cached rows each sequence sees; vis [B, T, N] query t sees new row j."""
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    lengths: torch.Tensor
    vis: torch.Tensor
    page_size: int


def paged_applies(cache: torch.Tensor) -> bool:
    """The CPU attention kernel reads this cache in place (float32 or bfloat16 on a CPU where it
    builds, no grad)."""
    return cache.dtype in (torch.float32, torch.bfloat16) and _kernel_applies(cache) and not torch.is_grad_enabled()


class Attention(nn.Module):
    """Projections and SDPA for grouped-query attention; the caller decides where K/V come from."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = Linear(h, self.n_heads * self.head_dim, bias=cfg.attention_bias)
        self.k_proj = Linear(h, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.v_proj = Linear(h, self.n_kv * self.head_dim, bias=cfg.attention_bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, h, bias=cfg.attention_bias and cfg.model_type != "qwen2")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.register_buffer("kv_packed", None, persistent=False)  # the k/v rows of qkv_proj, packed

    def pack(self) -> None:
        """Pack the k/v rows of the fused weight for `project_kv` (the projections pack themselves)."""
        if hasattr(self, "qkv_proj") and isinstance(self.qkv_proj, Linear):
            self.kv_packed = _packed_for_cpu(self.qkv_proj.weight[self.n_heads * self.head_dim:])

    def fuse(self, kv_apart: bool = False) -> None:
        """Replace q/k/v_proj by one `qkv_proj` (rows q, then k, then v): one GEMM per layer. With
        `kv_apart` (the drafter, whose context rows need k and v only), a fused projection in
        blocks keeps a copy of its k/v rows as `kv_proj` (a float one slices its weight instead)."""
        if hasattr(self, "qkv_proj"):
            return
        fused = _fused((self.q_proj, self.k_proj, self.v_proj))
        if fused is not None:
            self.qkv_proj = fused
            del self.q_proj, self.k_proj, self.v_proj
            if kv_apart and isinstance(fused, quant.QuantLinear):
                nq = self.n_heads * self.head_dim
                rows = torch.arange(nq, fused.out_features, device=fused.qs.device)
                bias = None if fused.bias is None else fused.bias.detach()[nq:]
                self.kv_proj = quant.QuantLinear(fused.form.rows(rows), bias)

    def project(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, H, D], k and v [B, T, Hkv, D], with q/k norms and RoPE applied."""
        if hasattr(self, "qkv_proj"):
            nq, nkv = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            q, k, v = self.qkv_proj(x).split([nq, nkv, nkv], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self._heads(q, k, v, cos, sin)

    def project_kv(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v only (the drafter's context): the k/v rows of the fused weight."""
        if hasattr(self, "kv_proj"):
            k, v = self.kv_proj(x).chunk(2, dim=-1)
        elif hasattr(self, "qkv_proj"):
            nq = self.n_heads * self.head_dim
            w, b = self.qkv_proj.weight[nq:], self.qkv_proj.bias
            k, v = dense(x, w, None if b is None else b[nq:], self.kv_packed).chunk(2, dim=-1)
        else:
            k, v = self.k_proj(x), self.v_proj(x)
        return self._heads(None, k, v, cos, sin)[1:]

    def _heads(self, q, k, v, cos, sin):
        k = k.unflatten(-1, (self.n_kv, self.head_dim))                  # [B, T, Hkv, D]
        v = v.unflatten(-1, (self.n_kv, self.head_dim))
        if self.k_norm is not None:
            k = self.k_norm(k)
        if q is not None:
            q = q.unflatten(-1, (self.n_heads, self.head_dim))           # [B, T, H, D]
            if self.q_norm is not None:
                q = self.q_norm(q)
            q = apply_rope(q, cos, sin)
        return q, apply_rope(k, cos, sin), v

    def attend(self, q, k, v, mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        # q: [B, T, H, D]; k, v: [B, S, Hkv, D]; mask: [B, 1, T, S] bool (True = visible)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask, is_causal=causal and mask is None, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).flatten(2))               # [B, T, hidden]


    def attend_paged(self, q, k, v, past: Paged) -> torch.Tensor:
        # q: [B, T, H, D]; k, v: [B, N, Hkv, D] of the new rows; cached rows read through past.
        # The kernel computes in float32: q widens here, the cache's rows (float32 or bf16, the model's
        # dtype) as they are read — exactly, so a bf16 cache gives what a float32 one would.
        dt = past.k_cache.dtype
        out = cpu_dense.paged_attention(q.float(), k.to(dt), v.to(dt), past.k_cache, past.v_cache, past.table,
                                        past.lengths, past.vis, past.page_size)  # [B, T, H, D]
        return self.o_proj(out.to(q.dtype).flatten(2))                   # [B, T, hidden]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = Linear(h, f, bias=b)
        self.up_proj = Linear(h, f, bias=b)
        self.down_proj = Linear(f, h, bias=b)

    def fuse(self) -> None:
        """Replace gate/up_proj by one `gate_up_proj` (rows gate, then up): one GEMM."""
        if hasattr(self, "gate_up_proj"):
            return
        fused = _fused((self.gate_proj, self.up_proj))
        if fused is not None:
            self.gate_up_proj = fused
            del self.gate_proj, self.up_proj

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
