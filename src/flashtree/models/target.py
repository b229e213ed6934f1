"""The target LM (qwen3 / llama / qwen2 decoder) with explicit positions, cache rows and masks.

`TargetModel.forward` runs any set of new tokens per sequence — a prompt, one token, a chain
or a draft tree — given where each token sits (RoPE position), which cache row it writes, and
which cache rows it may see. It returns final hidden states and, on request, drafter features
in HF's `hidden_states` convention (SPEC §2): feature id L = `hidden_states[L+1]`, the output of
decoder layer L, taken after the final norm for the last layer. It does not sample, schedule or
build masks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig
from ..kv_cache import KVCache
from .layers import MLP, Attention, RMSNorm, Rotary


@dataclass(slots=True)
class ForwardBatch:
    """Where the new tokens of one forward go and what they see."""
    slots: torch.Tensor       # [B] cache slot of each sequence
    rows: torch.Tensor        # [B, T] cache row each new token writes
    mask: torch.Tensor        # [B, 1, T, S] bool: token t may attend to cache row s
    cache: KVCache
    span: slice | None = None  # slots as a slice when they are consecutive: reads become views

    @classmethod
    def for_slots(cls, slots: list[int], rows, mask, cache: KVCache) -> "ForwardBatch":
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        return cls(torch.tensor(slots, device=rows.device), rows, mask, cache,
                   slice(slots[0], slots[0] + len(slots)) if consecutive else None)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, layer: int, fb: ForwardBatch | None, mask=None):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, cos, sin)
        if fb is not None:
            fb.cache.write(layer, fb.slots, fb.rows, k, v)
            k, v = fb.cache.read(layer, fb.span or fb.slots, fb.mask.shape[-1])
            mask = fb.mask
        x = x + self.self_attn.attend(q, k, v, mask, causal=True)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = Rotary(cfg)


class TargetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch | None = None,
                feature_layers: list[int] | None = None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, positions: [B, T]. With `fb` the K/V go through the cache; without it the
        tokens attend among themselves (causal, or `mask` [B, 1, T, T]) — the training path.
        Returns (final hidden [B, T, H], features [B, T, len(feature_layers)*H] or None); feature
        id L is HF `hidden_states[L+1]`, so the last layer's is the final-normed hidden."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary_emb(positions, x.dtype)
        wanted = set(feature_layers or ())
        by_id = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, i, fb, mask)
            if i in wanted:
                by_id[i] = x
        x = self.model.norm(x)
        if len(self.model.layers) - 1 in wanted:  # as transformers: the last entry is post-norm
            by_id[len(self.model.layers) - 1] = x
        features = torch.cat([by_id[i] for i in feature_layers], dim=-1) if feature_layers else None
        return x, features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def fuse(self) -> "TargetModel":
        """Fused q/k/v and gate/up GEMMs in every layer (inference only; same results)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self
