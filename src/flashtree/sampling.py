"""The one sampling pipeline: logits -> temperature -> top-k -> top-p -> min-p -> renormalise.

Used unchanged for plain decoding, for every node of a verify pass, and for the bonus token,
so speculative output has exactly the target's sampling distribution. Pure batched tensor
functions: each row carries its own parameters; rows with temperature 0 become one-hot argmax.
Randomness comes only from per-request `torch.Generator`s passed in by the caller.
"""
from __future__ import annotations

import torch


def logits_to_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V]; per-row temperature/top_k/top_p/min_p [R]. Returns probs [R, V] (fp32).

    Rule: p = softmax(logits / T); keep the k largest (k = 0: all); renormalise and keep the
    smallest descending prefix whose mass reaches top_p; keep tokens with p >= min_p * max p;
    renormalise. T == 0 rows are one-hot at the argmax (filters are then irrelevant).
    """
    logits = logits.float()
    greedy = temperature == 0                                                 # [R]
    scaled = logits / torch.where(greedy, 1.0, temperature).unsqueeze(-1)     # [R, V]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)               # [R, V]
    V = logits.shape[-1]
    rank = torch.arange(V, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp(max=V), V)
    drop = rank >= k.unsqueeze(-1)                                            # top-k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop |= (mass_before >= top_p.unsqueeze(-1)) & (top_p < 1).unsqueeze(-1)   # top-p (keeps rank 0)
    probs = probs.masked_fill(drop, 0.0)
    drop |= probs < min_p.unsqueeze(-1) * probs[:, :1]                        # min-p
    probs = probs.masked_fill(drop, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    out = torch.zeros_like(probs).scatter_(-1, order, probs)
    if greedy.any():
        onehot = torch.zeros_like(out).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        out = torch.where(greedy.unsqueeze(-1), onehot, out)
    return out


def sample(probs: torch.Tensor, spans: list[tuple[int, int]],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row of probs [R, V]. Rows spans[i][0]:spans[i][1] belong to request i
    and use its generator (None = greedy request: argmax, no randomness).
    Exponential race: argmax(p / E), E ~ Exp(1) i.i.d., is an exact draw from p and needs no sync."""
    noise = torch.ones_like(probs)
    for (lo, hi), gen in zip(spans, generators):
        if gen is not None and hi > lo:
            noise[lo:hi].exponential_(generator=gen)
    return (probs / noise).argmax(-1)
