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
from .layers import (
    MLP,
    Attention,
    Linear,
    Paged,
    RMSNorm,
    Rotary,
    page_rows,
    paged_applies,
)


class DrafterLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, kc, vc, rope_block, mask: torch.Tensor | None, past: tuple | None = None):
        """Keys are [past rows, context kc/vc (or None), block] under `mask`; returns x."""
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, *rope_block)
        if kc is not None:
            k, v = torch.cat([kc, k], dim=1), torch.cat([vc, v], dim=1)
        if isinstance(past, Paged):  # the CPU kernel reads the cached rows in place
            attn = self.self_attn.attend_paged(q, k, v, past)
        else:
            if past is not None:
                k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
            attn = self.self_attn.attend(q, k, v, mask)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        lc = cfg.layers
        self.fc = Linear(len(cfg.target_layer_ids) * lc.hidden_size, lc.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(lc) for _ in range(lc.num_hidden_layers))
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.rotary_emb = Rotary(lc)

    def forward(self, block_embeds: torch.Tensor, block_pos: torch.Tensor,
                ctx_feats: torch.Tensor | None, ctx_pos: torch.Tensor | None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """No cache (training): block_embeds [B, K, H] (target embeddings of the block tokens),
        block_pos [B, K]; ctx_feats [B, C, n*H] raw target features of the context, ctx_pos
        [B, C]; keys are [context, block] under `mask` [B, 1, K, C+K]. Returns [B, K, H]."""
        return self._run(block_embeds, block_pos, ctx_feats, ctx_pos, mask, None)[0]

    def forward_cached(self, block_embeds, block_pos, ctx_feats, ctx_pos, k_cache, v_cache, table, page_size: int,
                       past_len, ctx_len, block_len, cols):
        """One drafting pass against the drafter's context cache, reading it only.

        ctx_feats [B, C, n*H] are the features of context tokens not cached yet (their K/V are
        returned for the caller to write at rows past_len .. past_len+C-1); the block sees cached
        rows < past_len[b] (logical rows cols [S], read through the page table [B, pages]), context rows < ctx_len[b] and block rows < block_len[b]
        (non-causal). Returns (hidden [B, K, H], k_ctx, v_ctx [L, B, C, Hkv, D])."""
        B, K = block_pos.shape
        fresh = torch.arange(ctx_feats.shape[1], device=cols.device)[None, :] < ctx_len[:, None]
        own = torch.arange(K, device=cols.device)[None, :] < block_len[:, None]
        if paged_applies(k_cache):  # the CPU kernel reads the cache in place: no gather
            vis = torch.cat([fresh, own], dim=1)[:, None, :].expand(B, K, -1)             # [B, K, C+K]
            past = [Paged(k_cache[i], v_cache[i], table, past_len, vis, page_size) for i in range(len(self.layers))]
            return self._run(block_embeds, block_pos, ctx_feats, ctx_pos, None, past)
        seen = cols[None, :] < past_len[:, None]                                   # [B, S]
        mask = torch.cat([seen, fresh, own], dim=1)[:, None, None, :].expand(B, 1, K, -1)  # [B, 1, K, S+C+K]
        rows = page_rows(table, cols, page_size)                                    # [B, S]
        past = [(k_cache[i][rows], v_cache[i][rows]) for i in range(len(self.layers))]
        return self._run(block_embeds, block_pos, ctx_feats, ctx_pos, mask, past)

    def context_kv(self, ctx_feats: torch.Tensor, ctx_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache rows of context features alone: ctx_feats [B, C, n*H] at positions ctx_pos
        [B, C] -> k, v [L, B, C, Hkv, D]. A context row's K/V depend on its own features and
        position only (no block, no other row), so rows of many sequences can go as one flat
        batch [1, sum C, n*H] — no padding to the longest (see `DFlashDrafts.run`)."""
        ctx = self.hidden_norm(self.fc(ctx_feats))
        cos, sin = self.rotary_emb(ctx_pos, ctx.dtype)
        kv = [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])

    def _run(self, block_embeds, block_pos, ctx_feats, ctx_pos, mask, past):
        x = block_embeds
        rope_block = self.rotary_emb(block_pos, x.dtype)
        kc = vc = None
        if ctx_feats is not None and ctx_feats.shape[1] > 0:
            kc, vc = self.context_kv(ctx_feats, ctx_pos)                      # [L, B, C, Hkv, D]
        for i, layer in enumerate(self.layers):
            x = layer(x, None if kc is None else kc[i], None if vc is None else vc[i], rope_block, mask,
                      None if past is None else past[i])
        if past is None or kc is None:
            return self.norm(x), None, None
        return self.norm(x), kc, vc

    def fuse(self) -> DFlashDrafter:
        """Fused q/k/v and gate/up GEMMs in every layer (inference only; same results)."""
        for layer in self.layers:
            layer.self_attn.fuse(kv_apart=True)
            layer.mlp.fuse()
        return self
