"""The one sampling pipeline: logits -> temperature -> top-k -> top-p -> min-p -> renormalise.

Used unchanged for plain decoding, for every node of a verify pass, and for the bonus token,
so speculative output has exactly the target's sampling distribution. Pure batched tensor
functions: each row carries its own parameters; rows with temperature 0 become one-hot argmax.
Randomness comes only from per-request `Uniforms`: one uniform per *output position*, so the
token a request samples at position k is the same whichever round, tree, budget or batch draws
it — a seeded speculative run repeats plain decoding's seeded output token for token.

A `FilterPlan` (host-side facts about the batch's parameters) lets the pipeline skip work no row
needs — the vocabulary sort when no row uses top-k or top-p, the cut when no row filters at all —
without a device sync. It never changes the result.

Every filter cuts a row at a *logit*: top-k at the k-th largest, top-p at the last of the
smallest descending prefix whose mass reaches top_p, min-p at max + log(min_p) (the ratio of two
probabilities is that of their exponentiated logits, whatever the renormalisation). So the
filters need only each row's values in descending order (no indices, no scatter), and a token is
kept when its logit reaches the row's cut; tokens tied with the cut are all kept (as transformers'
top-k). Full-width work is float arithmetic only: on this CPU a bool compare or `where` over a
[8, 4096] block costs 45-110 µs against 7 µs for a subtraction.

Two forms of the same rule: the tensor pipeline (`logits_to_probs` + `sample`; CUDA runs it, and
the exactness checks take their reference distribution from it) and the host one
(`sample_host`), which the engine runs on the CPU: one call of the CPU kernel
(`models/cpu_sample.cpp`) where it is built, else the tensor pipeline. A torch op costs 3-10 µs
of dispatch here and the tensor pipeline is ~60 of them (0.4-0.7 ms to draw one row); the kernel
draws a row of the bundled target's logits in ~25 µs. Both forms give the same token for the
same u (tested on every filter combination); they differ only in float rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .models import cpu_dense


@dataclass(slots=True, frozen=True)
class FilterPlan:
    """What the rows of one call need, known on the host."""
    any_greedy: bool
    sort_width: int      # 0: no row uses top-k/top-p; else how many leading sorted tokens they need
    any_min_p: bool = False

    @staticmethod
    def of(temperature: list[float], top_k: list[int], top_p: list[float], min_p: list[float],
           vocab: int) -> FilterPlan:
        """Plan for rows with these parameters (greedy rows need no filtering)."""
        width, any_min_p = 0, False
        for t, k, p, m in zip(temperature, top_k, top_p, min_p):
            if t == 0:
                continue
            any_min_p |= m > 0
            if 0 < k < vocab:
                width = max(width, k)       # top-p of such a row acts inside its top-k
            elif p < 1:
                width = vocab               # top-p over the whole vocabulary needs a full sort
        return FilterPlan(any(t == 0 for t in temperature), width, any_min_p)


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
        plan = FilterPlan.of(temperature.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist(), V)
    greedy = temperature == 0                                                 # [R]
    scaled = logits / torch.where(greedy, 1.0, temperature).unsqueeze(-1)     # [R, V]
    top = scaled.amax(-1, keepdim=True)                                       # [R, 1]
    probs = (scaled - top).exp()                                              # [R, V] unnormalised
    mass = probs.sum(-1, keepdim=True)                                        # [R, 1]
    if plan.sort_width or plan.any_min_p:
        cut = cuts(scaled, top, mass, top_k, top_p, min_p, plan.sort_width)   # [R, 1]
        probs = probs * (torch.sign(scaled - cut) + 1).clamp_(max=1)          # 1 where logit >= cut
        mass = probs.sum(-1, keepdim=True)
    probs = probs / mass
    if plan.any_greedy:
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(-1), onehot, probs)
    return probs


def cuts(scaled: torch.Tensor, top: torch.Tensor, mass: torch.Tensor, top_k: torch.Tensor,
         top_p: torch.Tensor, min_p: torch.Tensor, width: int) -> torch.Tensor:
    """The smallest logit each row keeps -> [R, 1] (finite, or NaN for a NaN row). scaled [R, V];
    top [R, 1] its max; mass [R, 1] the sum of exp(scaled - top).

    min-p: logit >= max + log(min_p). With a sort (width > 0), for rows using top-k or top-p:
    with e[r] the unnormalised mass of sorted ranks <= r and z the top-k's mass (`mass` without
    top-k), rank r survives top-p when e[r-1] < top_p * z (rank 0 always), so the kept count is
    1 + #{r < W-1: e[r] < top_p * z}, at most k. Batched tensor ops on the logits' device, no host
    sync."""
    cut = top + min_p.log().unsqueeze(-1)                                     # log 0 = -inf
    if width:
        W, V = width, scaled.shape[-1]
        s = descending(scaled, W)                                             # [R, W]
        e = (s - top).double().exp().cumsum(-1)                               # [R, W] float64
        k = torch.where((top_k > 0) & (top_k < V), top_k, V).unsqueeze(-1)    # [R, 1] (V: no top-k)
        z = torch.where(k < V, e.gather(-1, k.clamp(max=W) - 1), mass.double())
        n = torch.searchsorted(e, top_p.double().unsqueeze(-1) * z).clamp(max=W - 1) + 1
        n = torch.where((top_p < 1).unsqueeze(-1), torch.minimum(n, k), k).clamp(max=W)  # kept count
        filtered = ((k < V) | (top_p < 1).unsqueeze(-1))
        cut = torch.where(filtered, torch.maximum(cut, s.gather(-1, n - 1)), cut)
    return cut.clamp(min=torch.finfo(scaled.dtype).min)   # a -inf logit then gets 0, not NaN


def descending(x: torch.Tensor, width: int) -> torch.Tensor:
    """The `width` largest values of each row of x [R, V], in descending order -> [R, width]."""
    if width < x.shape[-1]:
        return x.topk(width, dim=-1).values
    return x.sort(dim=-1, descending=True).values


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
        self._extend(end)
        return self.values[index]

    def at_host(self, index: np.ndarray, end: int) -> np.ndarray:
        """`at` for a CPU generator, with host arrays (index [R] int) -> [R] float64."""
        self._extend(end)
        return self.values.numpy()[index]

    def _extend(self, end: int) -> None:
        while self.values.numel() < end:
            block = torch.rand(self.BLOCK, generator=self.generator, dtype=torch.float64,
                               device=self.values.device)
            self.values = torch.cat([self.values, block])


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) (the first maximum), through numpy for a CPU float tensor: for a few rows of a
    vocabulary torch's CPU argmax costs ~46 us here ([9, 4096]), numpy's ~9 — it is every greedy
    round's draw. bf16/fp16 rows are widened to float32 first (exact, so the same first maximum):
    torch's bf16 argmax over SmolLM2's 49,152 logits costs ~155 us a row, widening and numpy's
    ~10 (`benchmarks/sampling_2026-11-30/measure_sampling.py --argmax --vocab 49152`, one thread)."""
    if x.device.type == "cpu" and x.is_floating_point() and not x.requires_grad:
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
        return torch.from_numpy(wide.numpy().argmax(-1))
    return x.argmax(-1)


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


def sample_host(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                min_p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """`sample(logits_to_probs(...))` on host arrays, for logits on the CPU: logits [R, V] float32,
    per-row temperature/top_p/min_p [R] float32, top_k [R] int64, u [R] float64 (read on sampled
    rows only) -> [R] int64 tokens, V where a sampled row has no valid mass. Through the CPU
    kernel (`models/cpu_sample.cpp`, one call) when it is built, else `sample_tensors`."""
    if cpu_dense.available():
        return cpu_dense.sample_rows(logits, temperature, top_k, top_p, min_p, u)
    return sample_tensors(logits, temperature, top_k, top_p, min_p, u)


def sample_tensors(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                   min_p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """`sample_host` through the tensor pipeline (a CPU without the kernel: ~60 torch ops a call)."""
    R, V = logits.shape
    t = torch.from_numpy
    plan = FilterPlan.of(temperature.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist(), V)
    probs = logits_to_probs(t(logits), t(temperature), t(top_k), t(top_p), t(min_p), plan)
    # one span: a greedy row's probs are one-hot at its argmax, which any u in [0, 1) draws (its own u
    # is not read, so it is set to 0)
    return sample(probs, [(0, R)], [t(np.where(temperature == 0, 0.0, u))]).numpy()
