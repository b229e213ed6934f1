"""The sampler: the target's draws from its logits under each sequence's sampling pipeline.

One rule for every row (SPEC §2): greedy sequences take the argmax; sampled ones apply temperature,
top-k, top-p and min-p, then draw with the uniform of the row's output position — so a token's
draw never depends on the round's shape (which sequences share it, how deep a tree is). On the
CPU the pipeline runs on host arrays (one kernel call where it is built); elsewhere as tensors.
It decides nothing about trees and changes no sequence.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .. import grammar, logit_processors
from ..sampling import FilterPlan, argmax_rows, logits_to_probs, sample, sample_host
from ..speculative.tree import DraftTree
from ..speculative.verify import VerifyOutput
from .round import VerifyInput
from .sequence import Sequence, TokenLogprob


def all_greedy(seqs: list[Sequence]) -> bool:
    """Every sequence decodes greedily (no seeded uniforms): the sampling pipeline is the argmax."""
    return all(s.uniforms is None for s in seqs)


class Sampler:
    def __init__(self, device: torch.device):
        self.device = device
        self.masked_rows, self.mask_seconds = 0, 0.0  # structured output: rows masked, and the time it took

    def sample(self, seqs: list[Sequence], logits: torch.Tensor, spans: list[tuple[int, int]],
               depths: torch.Tensor, deepest: list[int]) -> torch.Tensor:
        """[R] draws from logits [R, V]; rows spans[i] belong to seqs[i]. Row r is drawn with the
        u of output position len(output_ids) + depths[r] (depths [R] on the device; deepest[i]:
        seqs[i]'s largest)."""
        if all_greedy(seqs):
            return argmax_rows(logits)  # the pipeline is the argmax
        ps = [s.params for s in seqs]
        temps, top_ks, top_ps, min_ps = ([p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps],
                                         [p.min_p for p in ps])
        if logits.device.type == "cpu":  # the same rule on host arrays, in one kernel call where it is built
            reps = [hi - lo for lo, hi in spans]
            rows = np.asarray(depths)
            u = np.zeros(len(rows))
            for s, (lo, hi), deep in zip(seqs, spans, deepest):
                if s.uniforms is not None:
                    u[lo:hi] = s.uniforms.at_host(len(s.output_ids) + rows[lo:hi], len(s.output_ids) + deep + 1)
            per_row = (lambda v, dt: np.full(reps[0], v[0], dt)) if len(seqs) == 1 else \
                      (lambda v, dt: np.repeat(np.asarray(v, dt), reps))
            return torch.from_numpy(sample_host(
                logits.float().numpy(), per_row(temps, np.float32), per_row(top_ks, np.int64),
                per_row(top_ps, np.float32), per_row(min_ps, np.float32), u))
        reps = torch.tensor([hi - lo for lo, hi in spans], device=self.device)

        def per_row(values, dtype):
            return torch.tensor(values, dtype=dtype, device=self.device).repeat_interleave(reps)

        plan = FilterPlan.of(temps, top_ks, top_ps, min_ps, logits.shape[-1])
        probs = logits_to_probs(logits, per_row(temps, torch.float32), per_row(top_ks, torch.long),
                                per_row(top_ps, torch.float32), per_row(min_ps, torch.float32), plan)
        us = [None if s.uniforms is None else
              s.uniforms.at(len(s.output_ids) + depths[lo:hi], len(s.output_ids) + deep + 1)
              for s, (lo, hi), deep in zip(seqs, spans, deepest)]
        return sample(probs, spans, us)

    def adjusted(self, seqs: list[Sequence], logits: torch.Tensor, spans: list[tuple[int, int]],
                 vin: VerifyInput | None = None) -> torch.Tensor:
        """logits [R, V] with each sequence's logit processors applied to its rows (the same tensor
        when none has any). Row i of sequence b draws after the output so far and, in a round
        (`vin`), the drafted tokens on the path to its node: node i's ancestors past the root and
        itself (nodes are numbered parents first, so ascending index is root-to-node order). Then
        a constrained sequence's rows are masked to what its grammar allows after the same paths."""
        if not any(logit_processors.adjusts(s.params) or s.grammar is not None for s in seqs):
            return logits
        out = logits.float() if logits.dtype != torch.float32 else logits.clone()  # a copy either way
        for b, (s, (lo, hi)) in enumerate(zip(seqs, spans)):
            if s.grammar is not None:
                t0 = time.perf_counter()
                grammar.apply_masks(out[lo:hi], s.grammar.mask() if vin is None else s.grammar.tree_masks(
                    vin.tokens[b, :hi - lo].tolist(), vin.parents[b, :hi - lo].tolist()))
                self.masked_rows, self.mask_seconds = self.masked_rows + hi - lo, \
                    self.mask_seconds + time.perf_counter() - t0
            if not logit_processors.adjusts(s.params):
                continue
            paths = [[] if vin is None else vin.tokens[b, np.flatnonzero(vin.vis[b, i])[1:]].tolist()
                     for i in range(hi - lo)]
            logit_processors.apply_rows(out[lo:hi], s.params, s.prompt_ids, s.output_ids, paths, s.stop_ids)
        return out

    def draws(self, batch: list[Sequence], vin: VerifyInput, logits: torch.Tensor) -> np.ndarray:
        """[B, T] the target's draw at every node of the packed trees, on the host (the round's one
        copy of its verify results)."""
        logits = self.adjusted(batch, logits, vin.spans, vin)
        if all_greedy(batch):  # the argmax needs no row depths or spans
            return vin.scatter(argmax_rows(logits))
        return vin.scatter(self.sample(batch, logits, vin.spans, vin.row_depths, vin.deepest))

    def logprobs(self, logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
        """Each row's drawn token's log-probability under the target's distribution (log-softmax of
        logits [n, V] in float32, before temperature and filters) and the k likeliest tokens there."""
        lp = torch.log_softmax(logits.float(), dim=-1)                       # [n, V]
        own = lp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
        if k == 0:
            return [TokenLogprob(t, v) for t, v in zip(tokens, own)]
        values, ids = lp.topk(k, dim=-1)
        return [TokenLogprob(t, v, tuple(zip(i, w))) for t, v, i, w in zip(tokens, own, ids.tolist(), values.tolist())]

    def path_logprobs(self, batch: list[Sequence], trees: list[DraftTree], vin: VerifyInput, vout: VerifyOutput,
                      logits: torch.Tensor) -> list[list[TokenLogprob] | None]:
        """Each sequence's committed tokens' log-probabilities (None where it asks none): an accepted
        node's token is the draw at its parent, the bonus the draw at the deepest accepted node, so
        their rows are the accepted path's nodes in order (node i of sequence b: row lo_b + i)."""
        out: list[list[TokenLogprob] | None] = [None] * len(batch)
        for b, (s, (lo, _)) in enumerate(zip(batch, vin.spans)):
            if s.logprobs is None:
                continue
            path = np.flatnonzero(vout.accepted[b]).tolist()  # node order == depth order
            tokens = [int(trees[b].tokens[i]) for i in path[1:]] + [int(vout.bonus[b])]
            out[b] = self.logprobs(logits[[lo + i for i in path]], tokens, s.params.logprobs)
        return out

    def first(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Each sequence's first token (its output position 0) from its prompt's last logits [B, V]."""
        zero = torch.zeros(len(seqs), dtype=torch.long, device=self.device)
        logits = self.adjusted(seqs, logits, [(i, i + 1) for i in range(len(seqs))])
        return self.sample(seqs, logits, [(i, i + 1) for i in range(len(seqs))], zero, [0] * len(seqs)).tolist()
