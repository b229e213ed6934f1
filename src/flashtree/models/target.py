"""The target LM (qwen3 / llama / qwen2 decoder) with explicit positions, cache rows and masks.

`TargetModel.forward_cached` runs any set of new tokens per sequence — a prompt, one token, a
chain or a draft tree — given where each token sits (RoPE position), how many cached rows each
sequence sees and which new tokens see each other; it reads the KV cache and returns the new
K/V for the caller to write (so the function has no side effects and compiles as one graph).
`forward` is the same network without a cache (training). Both return final hidden states and,
on request, drafter features in HF's `hidden_states` convention (SPEC §2): feature id L =
`hidden_states[L+1]`, the output of decoder layer L, taken after the final norm for the last
layer. Nothing here samples, schedules, writes the cache or builds trees.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import cpu
from ..config import ModelConfig
from .layers import (
    MLP,
    Attention,
    Embedding,
    Linear,
    Paged,
    RMSNorm,
    Rotary,
    page_rows,
    paged_applies,
)
from .quant import QuantLinear


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.reduce = _identity  # tensor parallel: the sum of the ranks' partial outputs (parallel.py)

    def forward(self, x, cos, sin, mask=None, past: tuple | None = None):
        """past: (K, V) [B, S, Hkv, D] of cached rows, seen before the new tokens' own K/V under
        `mask` [B, 1, T, S+T]; or a `Paged` view of the cache (read in place by the CPU kernel).
        Returns (x, k, v) with k, v [B, T, Hkv, D] of the new tokens."""
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, cos, sin)
        if isinstance(past, Paged):
            attn = self.self_attn.attend_paged(q, k, v, past)
        else:
            keys, values = (k, v) if past is None else (torch.cat([past[0], k], 1), torch.cat([past[1], v], 1))
            attn = self.self_attn.attend(q, keys, values, mask, causal=past is None)
        x = x + self.reduce(attn)
        return x + self.reduce(self.mlp(self.post_attention_layernorm(x))), k, v


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = Rotary(cfg)


class TargetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg  # with tensor parallelism: this rank's share (heads, intermediate)
        self.model = Backbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # where the KV cache and the drafter keep their rows: None = the activations' dtype; the loader
        # sets bfloat16 for a target computing in float32 beside bf16 storage (`loader.resolve_dtypes`)
        self.cache_dtype: torch.dtype | None = None

    @property
    def compute_dtype(self) -> torch.dtype:
        """The activations' dtype: the final norm's (a float weight matrix may be stored narrower,
        an embedding's rows are widened to it, a projection in blocks returns its input's dtype)."""
        return self.model.norm.weight.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        """The KV cache's dtype (and the drafter's): `cache_dtype`, else the activations'."""
        return self.cache_dtype or self.compute_dtype

    def head_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The LM head's weight [V, H] as a dense `dtype` matrix, dequantized where the head is in
        blocks: the frozen head a drafter trains against (a copy; the model keeps its own)."""
        if isinstance(self.lm_head, QuantLinear):
            return self.lm_head.blocks.dequantize(dtype)
        return self.lm_head.weight.detach().to(dtype, copy=True)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                feature_layers: list[int] | None = None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No cache: input_ids, positions [B, T] attend among themselves (causal, or `mask`
        [B, 1, T, T]) — the training and reference path. Returns (final hidden [B, T, H],
        features [B, T, len(feature_layers)*H] or None)."""
        x, features, _, _ = self._run(input_ids, positions, feature_layers, mask, None)
        return x, features

    def forward_cached(self, input_ids, positions, k_cache, v_cache, table, page_size: int, lengths, vis, cols,
                       feature_layers: tuple[int, ...] = ()):
        """New tokens against a paged KV cache, reading it only (the caller writes the returned K/V).

        input_ids, positions [B, T]; k_cache, v_cache [L, rows, Hkv, D] (pages of page_size
        rows); table [B, pages]: each sequence's pages; lengths [B]: sequence b sees its cached
        rows < lengths[b]; vis [B, T, T] bool: new token t sees new token j (a tree's ancestors
        and itself); cols [S] = arange(S), S >= max length: the logical rows read. Returns
        (hidden [B, T, H], features or None, k_new, v_new [L, B, T, Hkv, D])."""
        B, T = input_ids.shape
        if paged_applies(k_cache):  # the CPU kernel reads the cache in place: no gather, no mask
            past = [Paged(k_cache[i], v_cache[i], table, lengths, vis, page_size) for i in range(len(self.model.layers))]
            return self._run(input_ids, positions, feature_layers, None, past)
        seen = (cols[None, :] < lengths[:, None])[:, None, :].expand(B, T, cols.shape[0])  # [B, T, S]
        mask = torch.cat([seen, vis], dim=2)[:, None]                                    # [B, 1, T, S+T]
        rows = page_rows(table, cols, page_size)                                          # [B, S]
        past = [(k_cache[i][rows], v_cache[i][rows]) for i in range(len(self.model.layers))]
        return self._run(input_ids, positions, feature_layers, mask, past)

    def _run(self, input_ids, positions, feature_layers, mask, past):
        """Feature id L is HF `hidden_states[L+1]`, so the last layer's is the final-normed hidden."""
        x = self.model.embed_tokens(input_ids).to(self.compute_dtype)  # (a no-op unless stored narrower)
        cos, sin = self.model.rotary_emb(positions, x.dtype)
        wanted = set(feature_layers or ())
        by_id, ks, vs = {}, [], []
        for i, layer in enumerate(self.model.layers):
            x, k, v = layer(x, cos, sin, mask, None if past is None else past[i])
            ks.append(k), vs.append(v)
            if i in wanted:
                by_id[i] = x
        x = self.model.norm(x)
        if len(self.model.layers) - 1 in wanted:  # as transformers: the last entry is post-norm
            by_id[len(self.model.layers) - 1] = x
        features = torch.cat([by_id[i] for i in feature_layers], dim=-1) if feature_layers else None
        if past is None:
            return x, features, None, None
        return x, features, torch.stack(ks), torch.stack(vs)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def fuse(self) -> TargetModel:
        """Fused q/k/v and gate/up GEMMs in every layer (inference only; same results)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
            cpu.return_free_heap()  # the parts each fused weight replaced, before the next layer's copies
        return self
