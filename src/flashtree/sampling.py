"""The one sampling pipeline: logits -> temperature -> top-k -> top-p -> min-p -> renormalise.

Used unchanged for plain decoding, for every node of a verify pass, and for the bonus token,
so speculative output has exactly the target's sampling distribution. Pure batched tensor
functions: each row carries its own parameters; rows with temperature 0 become one-hot argmax.
Randomness comes only from per-request `Uniforms`: one uniform per *output position*, so the
token a request samples at position k is the same whichever round, tree, budget or batch draws
it — a seeded speculative run repeats plain decoding's seeded output token for token.

A `FilterPlan` (host-side facts about the batch's parameters) lets the pipeline skip work no row
needs — the vocabulary sort when no row uses top-k or top-p, a partial `topk` instead of a full
sort when only top-k is used — without a device sync. It never changes the result.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class FilterPlan:
    """What the rows of one call need, known on the host."""
    any_greedy: bool
    sort_width: int      # 0: no row uses top-k/top-p; else how many leading sorted tokens they need

    @staticmethod
    def of(temperature: list[float], top_k: list[int], top_p: list[float], vocab: int) -> "FilterPlan":
        """Plan for rows with these parameters (greedy rows need no filtering)."""
        width = 0
        for t, k, p in zip(temperature, top_k, top_p):
            if t == 0:
                continue
            if 0 < k < vocab:
                width = max(width, k)       # top-p of such a row acts inside its top-k
            elif p < 1:
                width = vocab               # top-p over the whole vocabulary needs a full sort
        return FilterPlan(any(t == 0 for t in temperature), width)


def logits_to_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor, min_p: torch.Tensor, plan: FilterPlan | None = None) -> torch.Tensor:
    """logits [R, V]; per-row temperature/top_k/top_p/min_p [R]. Returns probs [R, V] (fp32).

    Rule: p = softmax(logits / T); keep the k largest (k = 0: all); renormalise and keep the
    smallest descending prefix whose mass reaches top_p; keep tokens with p >= min_p * max p;
    renormalise. T == 0 rows are one-hot at the argmax (filters are then irrelevant).
    `plan` must describe these parameters; None derives it from the tensors (a device sync).
    """
    logits = logits.float()
    V = logits.shape[-1]
    if plan is None:
        plan = FilterPlan.of(temperature.tolist(), top_k.tolist(), top_p.tolist(), V)
    greedy = temperature == 0                                                 # [R]
    scaled = logits / torch.where(greedy, 1.0, temperature).unsqueeze(-1)     # [R, V]
    probs = scaled.softmax(-1)                                                # [R, V]
    if plan.sort_width:
        W = plan.sort_width
        top, order = scaled.topk(W, dim=-1) if W < V else scaled.sort(dim=-1, descending=True)  # [R, W]
        rank = torch.arange(W, device=logits.device)
        k = torch.where(top_k > 0, top_k.clamp(max=W), W)
        drop = rank >= k.unsqueeze(-1)                                        # top-k
        kept = top.masked_fill(drop, float("-inf")).softmax(-1)              # renormalised over top-k
        mass_before = kept.cumsum(-1) - kept
        drop |= (mass_before >= top_p.unsqueeze(-1)) & (top_p < 1).unsqueeze(-1)  # top-p (keeps rank 0)
        filtered = torch.zeros_like(probs).scatter_(-1, order, kept.masked_fill(drop, 0.0))
        uses_sort = ((top_k > 0) & (top_k < V)) | (top_p < 1)                 # [R]
        probs = torch.where(uses_sort.unsqueeze(-1), filtered, probs)
    # min-p compares with the largest kept probability; the ratio ignores the renormalisation
    probs = probs.masked_fill(probs < min_p.unsqueeze(-1) * probs.amax(-1, keepdim=True), 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    if plan.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(-1), onehot, probs)
    return probs


class Uniforms:
    """A sampled request's uniform draws, one per output position: `at(k)` is the u that decides
    output token k. The stream is drawn from the request's own generator in fixed blocks of
    `BLOCK`, in order, so it depends on the seed only — not on how many rows a round draws.

    Why this keeps speculation exact and makes it repeat plain decoding: the verify rule commits,
    at depth d of the accepted path, the target's draw at that node, and that node's context *is*
    the committed context. With the draw at depth d made from u[n + d] (n = tokens already
    output), output token k is always F^-1(u[k]) under the target's distribution given the true
    prefix — plain decoding's token with the same u. Siblings share u[n + d], but only one node
    per depth is ever committed; and how far a round accepts depends only on the u's it commits,
    so every round starts on fresh ones."""
    BLOCK = 64
    __slots__ = ("generator", "values")

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.values = torch.empty(0, dtype=torch.float64, device=device)

    def at(self, index: torch.Tensor, end: int) -> torch.Tensor:
        """u at the output positions `index` [R] (long, on the generator's device) -> [R] float64;
        `end` > every index (known on the host: no device sync)."""
        while self.values.numel() < end:
            block = torch.rand(self.BLOCK, generator=self.generator, dtype=torch.float64,
                               device=self.values.device)
            self.values = torch.cat([self.values, block])
        return self.values[index]


def sample(probs: torch.Tensor, spans: list[tuple[int, int]], uniforms: list[torch.Tensor | None]) -> torch.Tensor:
    """Draw one token per row of probs [R, V]. Rows spans[i][0]:spans[i][1] belong to request i,
    drawn with its uniforms[i] [hi - lo] float64 in [0, 1) (None = greedy request: argmax, no
    randomness).

    Inverse CDF: with u ~ U[0, 1) per row, take the first token whose cumulative mass (float64)
    exceeds u * total. An exact draw from p that never picks a zero-probability token; one
    uniform per row, no host sync. A sampled row with no valid mass (NaN, inf or all zero) draws
    the sentinel V (no token): the caller fails that request instead of feeding V to the model."""
    R, device = probs.shape[0], probs.device
    requests = [(lo, hi, us) for (lo, hi), us in zip(spans, uniforms) if hi > lo]
    if all(us is None for _, _, us in requests):
        return probs.argmax(-1)
    u = torch.zeros(R, dtype=torch.float64, device=device)                    # [R]
    greedy_rows = torch.zeros(R, dtype=torch.bool, device=device)             # [R]
    for lo, hi, us in requests:
        if us is None:
            greedy_rows[lo:hi] = True
        else:
            u[lo:hi] = us
    cdf = probs.double().cumsum(-1)                                            # [R, V]
    total = cdf[:, -1]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # < total
    drawn = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)      # [R]
    drawn = torch.where(torch.isfinite(total) & (total > 0), drawn, probs.shape[-1])    # sentinel V
    return torch.where(greedy_rows, probs.argmax(-1), drawn)
