"""A request's logit processors: logit_bias, min_tokens and the repetition, presence and frequency
penalties — applied to one row's logits before the sampling pipeline (`sampling.py`).

Each is a function of the tokens generated before the row's draw, so under speculation each tree
node's row is processed along its own path (the output so far plus the drafted tokens from the
root's child down to the node itself); plain decoding, verification and the bonus token apply the
same rule, which keeps greedy output token-identical and sampled output exactly distributed. The
order (vLLM's): logit_bias, then min_tokens, then the repetition penalty, then presence and
frequency. Nothing here samples or knows a tree.
"""
from __future__ import annotations

from collections import Counter

import torch

from .sampling_params import SamplingParams


def adjusts(params: SamplingParams) -> bool:
    """Whether any processor changes this request's logits."""
    return bool(params.logit_bias) or params.min_tokens > 0 or params.repetition_penalty != 1.0 \
        or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0


def apply(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], generated: list[int],
          stop_ids: frozenset[int]) -> None:
    """Process one row's logits [V] (float32, in place) for a draw after `generated` output tokens:
    - logit_bias: each listed token's bias added;
    - min_tokens: while fewer than min_tokens tokens are generated, every stop id is impossible;
    - repetition_penalty r (HF's and vLLM's rule): each token seen in the prompt or the output has a
      positive logit divided by r, a negative one multiplied by r;
    - presence p and frequency f (OpenAI's rule): each generated token's logit less p and f times its
      count."""
    dev = logits.device
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=dev)
        logits[ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=dev)
    if len(generated) < params.min_tokens and stop_ids:
        logits[torch.tensor(sorted(stop_ids), dtype=torch.long, device=dev)] = float("-inf")
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(generated)), dtype=torch.long, device=dev)
        vals = logits[seen]
        r = params.repetition_penalty
        logits[seen] = torch.where(vals > 0, vals / r, vals * r)
    if (params.presence_penalty or params.frequency_penalty) and generated:
        counts = Counter(generated)
        ids = torch.tensor(list(counts), dtype=torch.long, device=dev)
        n = torch.tensor(list(counts.values()), dtype=logits.dtype, device=dev)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * n


def apply_rows(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], generated: list[int],
               paths: list[list[int]], stop_ids: frozenset[int]) -> None:
    """`apply` to rows [n, V] at once (float32, in place): row i draws after generated + paths[i] (a
    tree node's drafted path). The same values as n calls of `apply`, in a few tensor ops: what all
    rows share (the bias, the prompt and output's tokens) applied to every row together, then each
    path's own tokens as (row, token) pairs — a token the output already holds is only counted once
    more for frequency, and gets no second repetition or presence penalty."""
    dev = logits.device
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=dev)
        logits[:, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=dev)
    if params.min_tokens and stop_ids:
        held = [i for i, p in enumerate(paths) if len(generated) + len(p) < params.min_tokens]
        if held:
            logits[torch.tensor(held, device=dev)[:, None], torch.tensor(sorted(stop_ids), device=dev)] = float("-inf")
    seen = set(prompt_ids) | set(generated)
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        if seen:
            ids = torch.tensor(sorted(seen), dtype=torch.long, device=dev)
            vals = logits[:, ids]
            logits[:, ids] = torch.where(vals > 0, vals / r, vals * r)
        rows, toks = _pairs([sorted(set(p) - seen) for p in paths])
        if rows:
            rows, toks = torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)
            vals = logits[rows, toks]
            logits[rows, toks] = torch.where(vals > 0, vals / r, vals * r)
    if params.presence_penalty or params.frequency_penalty:
        counts = Counter(generated)
        if counts:
            ids = torch.tensor(list(counts), dtype=torch.long, device=dev)
            c = torch.tensor(list(counts.values()), dtype=logits.dtype, device=dev)
            logits[:, ids] -= params.presence_penalty + params.frequency_penalty * c
        pairs = [[(t, k) for t, k in Counter(p).items()] for p in paths]
        rows, toks = _pairs([[t for t, _ in q] for q in pairs])
        if rows:
            delta = [params.frequency_penalty * k + (params.presence_penalty if t not in counts else 0.0)
                     for q in pairs for t, k in q]
            logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                              -torch.tensor(delta, dtype=logits.dtype, device=dev), accumulate=True)


def _pairs(per_row: list[list[int]]) -> tuple[list[int], list[int]]:
    """[[token, ...] per row] -> (rows, tokens) of every (row, token) pair."""
    rows = [i for i, ts in enumerate(per_row) for _ in ts]
    return rows, [t for ts in per_row for t in ts]
