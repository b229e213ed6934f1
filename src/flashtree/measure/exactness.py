"""Statistical losslessness checks: speculative samples vs the exact target distribution.

On a tiny-vocabulary target the distribution of the first `n_tokens` generated tokens can be
enumerated exactly (V**n sequences through the same sampling pipeline). Many seeded
speculative runs are then compared with it by a chi-square test (expected counts < 5 pooled)
and by total-variation distance against the largest TV of 200 equally sized samples drawn from the exact
distribution itself. Every run generates past the tokens it counts, and a speculative cell
passes only if its mean accept length is above 1 — a check where no draft was ever verified
cannot fail and proves nothing. Negative controls — deliberately wrong verifiers, one only 10 %
off in temperature — show the check has the power to fail. Used by `flashtree verify` and the
test-suite; no CLI code here.
"""
from __future__ import annotations

import itertools
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import torch

from .. import grammar, logit_processors
from ..config import DrafterConfig, ModelConfig
from ..engine.engine import Engine
from ..engine.engine_config import AUTO_MAX_BUDGET, EngineConfig
from ..engine.round import verify_round
from ..grammar import Grammars
from ..models.drafter import DFlashDrafter
from ..models.target import TargetModel
from ..sampling import logits_to_probs
from ..sampling_params import SamplingParams
from ..speculative.costs import CostTable
from ..speculative.proposer import PLAIN, drafting_methods, needs_drafter, proposer_class
from ..speculative.tree import DraftOutput
from ..speculative.verify import verify_tree


def tiny_pair(vocab: int = 8, seed: int = 0, block_size: int = 3, dtype=torch.float64):
    """A random qwen3 target over `vocab` tokens (the last is the mask) and a random drafter."""
    raw = dict(model_type="qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
               tie_word_embeddings=True)
    torch.manual_seed(seed)
    target = TargetModel(ModelConfig.from_dict(raw, source="<tiny target>"))
    dcfg = DrafterConfig.from_dict({**raw, "architectures": ["DFlashDraftModel"], "block_size": block_size,
                                    "num_hidden_layers": 1,
                                    "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": [0, 1]}},
                                   source="<tiny drafter>")
    drafter = DFlashDrafter(dcfg)
    with torch.no_grad():
        for m in (target, drafter):
            for p in m.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.5)  # peaked logits: some continuations are likely, many are not
    return target.to(dtype).eval().requires_grad_(False), drafter.to(dtype).eval().requires_grad_(False)


@torch.inference_mode()
def exact_distribution(target: TargetModel, prompt: list[int], params: SamplingParams, n_tokens: int,
                       grammars: Grammars | None = None, generated: tuple[int, ...] = ()) -> dict:
    """{token tuple: probability} of the n_tokens generated after `generated` (tokens the request
    already generated after `prompt`; no stops), the request's logit processors applied after each
    prefix, and its grammar's mask (params.structured, compiled by `grammars`) after it: a state
    started fresh and fed the output so far token by token."""
    V = target.config.vocab_size
    dist = {(): 1.0}
    for _ in range(n_tokens):
        prefixes = list(dist)
        ids = torch.tensor([prompt + list(generated) + list(p) for p in prefixes])
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        hidden, _ = target(ids, pos)
        logits = target.logits(hidden[:, -1]).float()
        if logit_processors.adjusts(params):
            for i, p in enumerate(prefixes):
                logit_processors.apply(logits[i], params, prompt, list(generated) + list(p),
                                       frozenset(params.stop_token_ids or ()))
        if params.structured is not None:
            for i, p in enumerate(prefixes):
                state = grammars.start(params.structured)
                for t in generated + p:
                    state.accept(t)
                grammar.apply_masks(logits[i:i + 1], state.mask())
        n = len(prefixes)
        probs = logits_to_probs(logits, torch.full((n,), float(params.temperature)),
                                torch.full((n,), params.top_k), torch.full((n,), float(params.top_p)),
                                torch.full((n,), float(params.min_p))).double().numpy()
        dist = {p + (t,): dist[p] * probs[i, t] for i, p in enumerate(prefixes) for t in range(V) if probs[i, t] > 0}
    return dist


class Samples(NamedTuple):
    counts: Counter             # first-n_tokens tuple -> runs that began with it
    mean_tau: float             # mean accept length over every round of every run
    prefix_hit_tokens: int      # prompt tokens the prefix cache served


def sample_sequences(target, drafter, prompt, params: SamplingParams, method: str, budget: int | str | None,
                     n_samples: int, n_tokens: int, seed: int = 0, batch: int = 512,
                     patch=None, compile: bool = False, page_size: int = 16,
                     topk: int | None = None, grammars: Grammars | None = None) -> Samples:
    """The first n_tokens of n_samples independent seeded runs, counted, with their mean tau and the
    engine's prefix-cache hit tokens (a small page_size makes the prompt's first pages shared by
    every later run)."""
    # generate a little past n_tokens so the first round's tree is not cut to depth 1
    max_tokens = n_tokens + (drafter.config.block_size - 2 if drafter is not None else 0)
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch,
                                               max_model_len=len(prompt) + max_tokens + 1,
                                               max_budget=budget if isinstance(budget, int) else AUTO_MAX_BUDGET,
                                               max_queue=n_samples, page_size=page_size,
                                               compile=compile, topk=topk), grammars=grammars)
    if proposer_class(method).sized_by_costs:  # (ngram) its drafts follow measured costs; a cell verifies
        # them whole (flat, pinned costs)
        eng.adaptive.costs = flat_costs()
    if patch is not None:
        patch(eng)
    seqs = [eng.add_request(prompt, replace(params, max_tokens=max_tokens, seed=seed + i, ignore_eos=True))
            for i in range(n_samples)]
    while eng.has_work():
        eng.step()
    taus = [t for s in seqs for t in s.metrics.accept_lengths]
    counts = Counter(tuple(s.output_ids[:n_tokens]) for s in seqs)
    return Samples(counts, sum(taus) / len(taus) if taus else 0.0, eng.stats.prefix_hit_tokens)


def flat_costs(batches=(1, 512), widths=(1, 64)) -> CostTable:
    """A pinned cost table in which a forward costs the same at every width: every draft pays."""
    costs = CostTable(learn=False)
    for b in batches:
        for t in widths:
            costs.record_verify(b, t, 1e-3)
    return costs


def target_drafts(target: TargetModel):
    """A patch for `sample_sequences`: drafts are the target's own most likely continuation of each
    sequence's committed tokens, with its full ranking at every depth of that chain. They depend on
    committed tokens only, never on the verify draws, so decoding stays lossless; unlike the random
    tiny drafter (whose argmax chain is almost never accepted) they are accepted often, so dflash
    chains and deep tree paths are really walked and committed."""
    table: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    @torch.inference_mode()
    def ranked(ctx: tuple) -> tuple[np.ndarray, np.ndarray]:
        if ctx not in table:
            ids = torch.tensor([ctx])
            hidden, _ = target(ids, torch.arange(len(ctx))[None])
            lp = torch.log_softmax(target.logits(hidden[:, -1]).double(), -1)[0].numpy()
            order = np.argsort(-lp, kind="stable")
            table[ctx] = lp[order], order
        return table[ctx]

    def patch(engine: Engine) -> None:
        def draft(batch):
            out = {}
            for s in batch:
                if s.method == PLAIN or s.depth_limit(engine.max_model_len) <= 0:
                    continue
                ctx, lps, ids = tuple(s.prompt_ids + s.output_ids), [], []
                for _ in range(s.block_size - 1):
                    lp, order = ranked(ctx)
                    lps.append(lp)
                    ids.append(order)
                    ctx += (int(order[0]),)
                out[s] = DraftOutput(np.stack(lps), np.stack(ids))
            return out
        engine.drafts.source = draft  # the seam for where drafts come from
    return patch


_TARGET_DRAFTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _target_drafts(target: TargetModel):
    """target_drafts(target), built once per target (its table is reused across cells)."""
    if target not in _TARGET_DRAFTS:
        _TARGET_DRAFTS[target] = target_drafts(target)
    return _TARGET_DRAFTS[target]


def chi_square_pooled(counts: Counter, exact: dict, n: int) -> float:
    """Pearson chi-square p-value; categories with expected count < 5 are pooled into one."""
    from scipy.stats import chi2
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for k, p in exact.items():
        e = p * n
        if e < 5:
            pool_o += counts.get(k, 0)
            pool_e += e
        else:
            obs.append(counts.get(k, 0))
            exp.append(e)
    outside = sum(c for k, c in counts.items() if k not in exact)  # impossible sequences
    if outside:
        return 0.0
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    obs, exp = np.array(obs, dtype=float), np.array(exp)
    if len(obs) < 2:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(stat, len(obs) - 1))


def total_variation(counts: Counter, exact: dict, n: int) -> float:
    keys = set(exact) | set(counts)
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


def reference_tv(exact: dict, n: int, draws: int = 200, seed: int = 0) -> float:
    """Largest TV among `draws` samples of size n taken directly from the exact distribution."""
    rng = np.random.default_rng(seed)
    keys = list(exact)
    p = np.array([exact[k] for k in keys])
    p = p / p.sum()
    tvs = [0.5 * np.abs(rng.multinomial(n, p) / n - p).sum() for _ in range(draws)]
    return float(max(tvs))


@dataclass(slots=True)
class Cell:
    method: str
    budget: int | str | None   # an int, "auto" (chosen each round) or None (the method's default)
    params: SamplingParams
    n: int
    drafts: str = "model"  # "model": the pair's drafter; "target": target_drafts (often accepted)
    compile: bool = False  # the engine's model runner compiled (torch.compile) or eager
    page_size: int = 16    # KV cache page size (small: the prompt's pages are shared via the prefix cache)
    topk: int | None = None  # the engine-wide ddtree branching cap (LLM(topk=...))
    p_value: float = 0.0
    tv: float = 0.0
    tv_limit: float = 0.0
    categories: int = 0
    passed: bool = False
    n_tokens: int = 0                # the leading tokens of each run that were counted
    mean_accept_length: float = 0.0
    drafts_verified: bool = False    # ar, or tau > 1: else the check proved nothing about drafts
    prefix_hit_tokens: int = 0

    def rejected(self) -> bool:
        """The statistics flag this cell (what a negative control must show), with drafts verified."""
        return self.drafts_verified and not (self.p_value > P_MIN and self.tv <= self.tv_limit)

    def label(self) -> str:
        p = self.params
        b = f"/{self.budget}" if self.budget else ""
        d = "" if self.drafts == "model" else f" drafts={self.drafts}"
        c = " compiled" if self.compile else ""
        return f"{self.method}{b} T={p.temperature} top_k={p.top_k} top_p={p.top_p} min_p={p.min_p}{d}{c}"


P_MIN, TV_MARGIN = 1e-3, 0.005


def check_cell(target, drafter, prompt, cell: Cell, n_tokens: int | None = None, seed: int = 0, patch=None,
               exact_of=None, grammars: Grammars | None = None) -> Cell:
    """Sample cell.n runs and test their first n_tokens against the exact distribution. The default
    n_tokens = block_size + 1 counts the prefill token and every draw of the first round — root,
    each depth of the accepted path, and the bonus after a full accept. exact_of: the model whose
    exact distribution the samples are tested against (default `target`; another one is a
    negative control). grammars: what compiles cell.params.structured."""
    if n_tokens is None:
        n_tokens = drafter.config.block_size + 1 if drafter is not None else 3
    cell.n_tokens = n_tokens
    exact = exact_distribution(target if exact_of is None else exact_of, prompt, cell.params, n_tokens, grammars)
    if cell.drafts == "target":
        drafts, wrong = _target_drafts(target), patch
        patch = (lambda eng: (drafts(eng), wrong(eng))) if wrong is not None else drafts
    elif cell.drafts != "model":
        raise ValueError(f"drafts must be 'model' or 'target', got {cell.drafts!r}")
    counts, mean_tau, cell.prefix_hit_tokens = sample_sequences(
        target, drafter, prompt, cell.params, cell.method, cell.budget, cell.n, n_tokens, seed=seed, patch=patch,
        compile=cell.compile, page_size=cell.page_size, topk=cell.topk, grammars=grammars)
    cell.mean_accept_length = mean_tau
    cell.p_value = chi_square_pooled(counts, exact, cell.n)
    cell.tv = total_variation(counts, exact, cell.n)
    cell.tv_limit = reference_tv(exact, cell.n, seed=seed) + TV_MARGIN
    cell.categories = len(exact)
    cell.drafts_verified = cell.method == PLAIN or mean_tau > 1
    cell.passed = bool(cell.p_value > P_MIN and cell.tv <= cell.tv_limit and cell.drafts_verified)
    return cell


@dataclass(slots=True)
class PositionCheck:
    """Speculative samples of a real pair against the target's exact next-token distributions.

    A real vocabulary cannot be enumerated over several tokens, but one position can: among runs
    whose first k tokens agree (a prefix seen at least `min_count` times), token k must follow the
    target's sampling distribution after prompt + prefix. Each such (k, prefix) is a pooled
    chi-square test; the check passes when the smallest p-value clears P_MIN / tests
    (Bonferroni) and drafts were verified (mean accept length above 1)."""
    label: str
    n: int
    tests: list[dict] = field(default_factory=list)  # {position, prefix, count, p_value, tv}
    mean_accept_length: float = 0.0
    passed: bool = False

    @property
    def min_p(self) -> float:
        return min((t["p_value"] for t in self.tests), default=1.0)

    def rejected(self) -> bool:
        """The statistics flag it (what a negative control must show), with drafts verified."""
        return self.mean_accept_length > 1 and bool(self.tests) and self.min_p <= P_MIN / len(self.tests)


def next_tokens(counts: Counter, k: int) -> dict[tuple, Counter]:
    """Sampled tuples grouped by their first k tokens: {prefix: Counter of (token k,)}."""
    out: dict[tuple, Counter] = {}
    for seq, c in counts.items():
        out.setdefault(seq[:k], Counter())[seq[k:k + 1]] += c
    return out


def position_check(target, drafter, prompt: list[int], params: SamplingParams, method: str,
                   budget: int | str | None, n: int, positions=(1, 2, 3), min_count: int = 300,
                   seed: int = 0, patch=None, batch: int = 64, grammars: Grammars | None = None) -> PositionCheck:
    """n seeded runs of `method`; each (position k in `positions`, prefix of k tokens seen at
    least min_count times) tested against the exact distribution (see PositionCheck). Position 0
    is the prefill's draw; later ones come out of verified trees (runs generate past them)."""
    counts, tau, _ = sample_sequences(target, drafter, prompt, params, method, budget, n, max(positions) + 1,
                                      seed=seed, patch=patch, batch=batch, grammars=grammars)
    check = PositionCheck(f"{method}{'/' + str(budget) if budget else ''} T={params.temperature} "
                          f"top_p={params.top_p}", n, mean_accept_length=tau)
    for k in positions:
        for prefix, nxt in next_tokens(counts, k).items():
            m = sum(nxt.values())
            if m < min_count:
                continue
            exact = exact_distribution(target, prompt, params, 1, grammars, generated=prefix)
            check.tests.append({"position": k, "prefix": list(prefix), "count": m,
                                "p_value": chi_square_pooled(nxt, exact, m), "tv": total_variation(nxt, exact, m)})
    check.passed = bool(check.tests) and tau > 1 and check.min_p > P_MIN / len(check.tests)
    return check


FILTERS = {"none": dict(), "top_k": dict(top_k=3), "top_p": dict(top_p=0.8), "min_p": dict(min_p=0.1),
           "all": dict(top_k=4, top_p=0.9, min_p=0.05)}


def grid(temperatures=(0.7, 1.0, 1.5), filters=tuple(FILTERS), methods=None,
         n: int = 20000, drafts=("model",)) -> list[Cell]:
    """Cells of every (temperature, filter, (method, budget), drafts); methods None: every drafting
    method, a budget-sized one at budget 6."""
    if methods is None:
        methods = [(m, 6 if proposer_class(m).sized_by_budget else None) for m in drafting_methods()]
    return [Cell(m, b, SamplingParams(temperature=t, **FILTERS[f]), n, d)
            for t, f, (m, b), d in itertools.product(temperatures, filters, methods, drafts)]


# --- negative controls: verifiers that are wrong on purpose; a sound check must flag them ------
def wrong_temperature(engine: Engine, factor: float = 1.1) -> None:
    """Verify-pass draws use temperature x factor (a classic plumbing bug). On the tiny pair at
    T=1, top_k=5, 20,000 samples of 4 tokens: x1.1 moves TV by 0.06 and is caught with a chi-square
    noncentrality of ~450; the check's power limit is near x1.04 (x1.05 is caught ~98 % of the
    time, x1.03 ~20 %) — a subtle error, not only a gross one, fails it."""
    engine.verifier = lambda batch, vin, logits, draw: verify_round(batch, vin, logits / factor, draw)


def greedy_walk_sampled_bonus(engine: Engine) -> None:
    """Walk the tree with argmax draws but sample the bonus: lossy at T > 0."""
    def verifier(batch, vin, logits, draw):
        sampled = draw(batch, vin, logits)                                      # [B, T] on the host
        greedy = vin.scatter(logits.argmax(-1))
        out = verify_tree(vin.tokens, vin.parents, vin.depths, vin.valid, greedy, vin.vis)
        out.bonus = sampled[np.arange(len(batch)), out.last]
        return out
    engine.verifier = verifier


NEGATIVE_CONTROLS = {"temperature_x1.1": wrong_temperature, "greedy_walk_sampled_bonus": greedy_walk_sampled_bonus}

__all__ = ["tiny_pair", "exact_distribution", "sample_sequences", "target_drafts", "chi_square_pooled",
           "total_variation", "reference_tv", "Cell", "check_cell", "grid", "NEGATIVE_CONTROLS",
           "PositionCheck", "position_check"]


def two_sample_p(a: Counter, b: Counter) -> float:
    """Chi-square p-value that counts `a` and `b` come from one distribution; categories with fewer
    than 10 counts in the two together are pooled into one."""
    from scipy.stats import chi2_contingency
    keys = sorted(set(a) | set(b))
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]], dtype=float)
    big = table.sum(0) >= 10
    pooled = np.concatenate([table[:, big], table[:, ~big].sum(1, keepdims=True)], axis=1)
    pooled = pooled[:, pooled.sum(0) > 0]
    return float(chi2_contingency(pooled)[1]) if pooled.shape[1] > 1 else 1.0


def two_sample_tests(plain: Counter, spec: Counter, n_tokens: int, min_count: int) -> list[dict]:
    """Plain against speculative samples of n_tokens-tuples: the joint tuples, then at each
    position k the next token after every k-token prefix that both samples hold at least
    min_count times (a conditional concentrates on few tokens, so it sees what the sparse joint
    table pools away)."""
    tests = [{"position": "joint", "prefix": [], "count": sum(spec.values()), "p_value": two_sample_p(plain, spec)}]
    for k in range(n_tokens):
        a, b = next_tokens(plain, k), next_tokens(spec, k)
        for prefix in sorted(set(a) & set(b)):
            if min(sum(a[prefix].values()), sum(b[prefix].values())) >= min_count:
                tests.append({"position": k, "prefix": list(prefix), "count": sum(b[prefix].values()),
                              "p_value": two_sample_p(a[prefix], b[prefix])})
    return tests


def compare_with_plain(llm, n: int = 3000, prompts: list | None = None, n_tokens: int = 3,
                       temperatures=(1.0,), budget: int = 16, max_tokens: int | None = None, top_p: float = 1.0,
                       methods=None, patch=None, min_count: int = 100) -> list[dict]:
    """Two-sample chi-square: speculative vs plain (ar) samples of the first n_tokens on a real pair
    (`two_sample_tests`: the joint tuples and each well-populated conditional, Bonferroni).

    It needs no reference forward, so it holds in any dtype: in bfloat16 an uncached reference
    rounds differently from the engine's paged forward, and the two-sample test compares the
    engine with itself (plain decoding is exact by definition). Prompts are strings or token id
    lists. Runs generate `max_tokens` (default n_tokens + the drafter's block size) so the counted
    tokens come out of verified drafts (with max_tokens == n_tokens the depth limit leaves nothing
    to verify); a speculative row passes only if its Bonferroni p (the least p times the number of
    tests) is above P_MIN and its mean accept length is above 1. `patch(engine)` (a negative
    control) is applied after the plain samples, before the first speculative ones, and stays
    applied. `methods` None: every method that reads the drafter."""
    methods = methods or [m for m in drafting_methods() if needs_drafter(m)]
    prompts = prompts or ["def main(", "import os\n"]
    max_tokens = max_tokens if max_tokens is not None else n_tokens + llm.engine.drafter_block_size
    if max_tokens < n_tokens:
        raise ValueError(f"max_tokens ({max_tokens}) must be >= n_tokens ({n_tokens})")
    rows = []
    for prompt, T in itertools.product(prompts, temperatures):
        def counts(method, seed, T=T, prompt=prompt):
            ps = [SamplingParams(temperature=T, top_p=top_p, max_tokens=max_tokens, seed=seed + i, ignore_eos=True)
                  for i in range(n)]
            outs = llm.generate([prompt] * n, ps, use_tqdm=False, method=method,
                                budget=budget if proposer_class(method).sized_by_budget else None)
            taus = [t for o in outs for t in o.metrics.accept_lengths]
            return Counter(tuple(o.token_ids[:n_tokens]) for o in outs), sum(taus) / max(len(taus), 1)
        plain, _ = counts(PLAIN, 0)
        if patch is not None:
            patch(llm.engine)
        for method in methods:
            spec, tau = counts(method, 10 ** 6)
            tests = two_sample_tests(plain, spec, n_tokens, min_count)
            p = min(1.0, min(t["p_value"] for t in tests) * len(tests))
            rows.append({"prompt": prompt, "temperature": T, "top_p": top_p, "method": method, "n": n,
                         "n_tokens": n_tokens, "max_tokens": max_tokens, "p_value": p, "tests": tests,
                         "categories": len(set(plain) | set(spec)), "mean_accept_length": tau,
                         "passed": p > P_MIN and tau > 1})
    return rows
