"""The DFlash block-diffusion drafter (z-lab `DFlashDraftModel` weight layout).

Target features (outputs of `target_layer_ids`) pass through `fc` + `hidden_norm`; every drafter
layer projects them with its own k_proj/v_proj into extra context K/V. A block
[bonus, MASK x (K-1)] attends non-causally to that context and to itself; slot k's final hidden
state, through the *target's* LM head, is the draft distribution for position start+k.
The drafter has no embedding or LM head of its own and does not build trees or sample.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import DrafterConfig
from .layers import MLP, Attention, RMSNorm, Rotary
from .target import ForwardBatch


class DrafterLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, ctx, rope_block, rope_ctx, layer: int, fb: ForwardBatch | None,
                ctx_rows: torch.Tensor | None, mask: torch.Tensor | None):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, *rope_block)
        if ctx is not None:
            kc, vc = self.self_attn.project_kv(ctx, *rope_ctx)
        if fb is not None:
            if ctx is not None:  # context first: padded context rows may point at block rows
                fb.cache.write(layer, fb.slots, ctx_rows, kc, vc)
            fb.cache.write(layer, fb.slots, fb.rows, k, v)
            k, v = fb.cache.read(layer, fb.span or fb.slots, fb.mask.shape[-1])
            mask = fb.mask
        elif ctx is not None:
            k, v = torch.cat([kc, k], dim=1), torch.cat([vc, v], dim=1)
        x = x + self.self_attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        lc = cfg.layers
        self.fc = nn.Linear(len(cfg.target_layer_ids) * lc.hidden_size, lc.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(lc) for _ in range(lc.num_hidden_layers))
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.rotary_emb = Rotary(lc)

    def forward(self, block_embeds: torch.Tensor, block_pos: torch.Tensor,
                ctx_feats: torch.Tensor | None, ctx_pos: torch.Tensor | None,
                fb: ForwardBatch | None = None, ctx_rows: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds [B, K, H] (target embeddings of the block tokens), block_pos [B, K];
        ctx_feats [B, C, n*H] raw target features of context tokens not yet cached, ctx_pos [B, C].
        With `fb` context K/V are cached at `ctx_rows` and the block at `fb.rows`; without it
        (training) keys are [context, block] under `mask` [B, 1, K, C+K]. Returns [B, K, H]."""
        x = block_embeds
        rope_block = self.rotary_emb(block_pos, x.dtype)
        ctx, rope_ctx = None, None
        if ctx_feats is not None and ctx_feats.shape[1] > 0:
            ctx = self.hidden_norm(self.fc(ctx_feats))
            rope_ctx = self.rotary_emb(ctx_pos, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, rope_block, rope_ctx, i, fb, ctx_rows, mask)
        return self.norm(x)

    def fuse(self) -> "DFlashDrafter":
        """Fused q/k/v and gate/up GEMMs in every layer (inference only; same results)."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self
