"""Statistical losslessness checks: speculative samples vs the exact target distribution.

On a tiny-vocabulary target the distribution of the first `n_tokens` generated tokens can be
enumerated exactly (V**n sequences through the same sampling pipeline). Many seeded
speculative runs are then compared with it by a chi-square test (expected counts < 5 pooled)
and by total-variation distance against the largest TV of 200 equally sized samples drawn from the exact
distribution itself. Negative controls — deliberately wrong verifiers — show the check has
the power to fail. Used by `flashtree verify` and the test-suite; no CLI code here.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import DrafterConfig, ModelConfig
from .engine.engine import Engine, EngineConfig
from .models.drafter import DFlashDrafter
from .models.target import TargetModel
from .sampling import logits_to_probs
from .sampling_params import SamplingParams
from .spec.verify import verify_tree


def tiny_pair(vocab: int = 8, seed: int = 0, block_size: int = 4, dtype=torch.float64):
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
def exact_distribution(target: TargetModel, prompt: list[int], params: SamplingParams, n_tokens: int) -> dict:
    """{token tuple: probability} of the first n_tokens generated tokens (no stops)."""
    V = target.config.vocab_size
    dist = {(): 1.0}
    for _ in range(n_tokens):
        prefixes = list(dist)
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        hidden, _ = target(ids, pos)
        logits = target.logits(hidden[:, -1])
        n = len(prefixes)
        probs = logits_to_probs(logits, torch.full((n,), float(params.temperature)),
                                torch.full((n,), params.top_k), torch.full((n,), float(params.top_p)),
                                torch.full((n,), float(params.min_p))).double().numpy()
        dist = {p + (t,): dist[p] * probs[i, t] for i, p in enumerate(prefixes) for t in range(V) if probs[i, t] > 0}
    return dist


def sample_sequences(target, drafter, prompt, params: SamplingParams, method: str, budget: int | None,
                     n_samples: int, n_tokens: int, seed: int = 0, batch: int = 512,
                     patch=None) -> tuple[Counter, float]:
    """Counts of the first n_tokens of n_samples independent seeded runs, and their mean tau."""
    # generate a little past n_tokens so the first round's tree is not cut to depth 1
    max_tokens = n_tokens + (drafter.config.block_size - 2 if drafter is not None else 0)
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch,
                                               max_model_len=len(prompt) + max_tokens + 1,
                                               max_budget=max(budget or 1, 1), max_queue=n_samples))
    if patch is not None:
        patch(eng)
    base = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    seqs = [eng.add_request(prompt, SamplingParams(**base, max_tokens=max_tokens, seed=seed + i, ignore_eos=True))
            for i in range(n_samples)]
    while eng.has_work():
        eng.step()
    taus = [t for s in seqs for t in s.metrics.accept_lengths]
    counts = Counter(tuple(s.output_ids[:n_tokens]) for s in seqs)
    return counts, (sum(taus) / len(taus) if taus else 0.0)


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
    budget: int | None
    params: SamplingParams
    n: int
    p_value: float = 0.0
    tv: float = 0.0
    tv_limit: float = 0.0
    categories: int = 0
    passed: bool = False
    notes: dict = field(default_factory=dict)

    def label(self) -> str:
        p = self.params
        b = f"/{self.budget}" if self.budget else ""
        return f"{self.method}{b} T={p.temperature} top_k={p.top_k} top_p={p.top_p} min_p={p.min_p}"


P_MIN, TV_MARGIN = 1e-3, 0.005


def check_cell(target, drafter, prompt, cell: Cell, n_tokens: int = 3, seed: int = 0, patch=None) -> Cell:
    exact = exact_distribution(target, prompt, cell.params, n_tokens)
    counts, mean_tau = sample_sequences(target, drafter, prompt, cell.params, cell.method, cell.budget,
                                        cell.n, n_tokens, seed=seed, patch=patch)
    cell.notes["mean_accept_length"] = mean_tau
    cell.p_value = chi_square_pooled(counts, exact, cell.n)
    cell.tv = total_variation(counts, exact, cell.n)
    cell.tv_limit = reference_tv(exact, cell.n, seed=seed) + TV_MARGIN
    cell.categories = len(exact)
    cell.passed = cell.p_value > P_MIN and cell.tv <= cell.tv_limit
    return cell


FILTERS = {"none": dict(), "top_k": dict(top_k=3), "top_p": dict(top_p=0.8), "min_p": dict(min_p=0.1),
           "all": dict(top_k=4, top_p=0.9, min_p=0.05)}


def grid(temperatures=(0.7, 1.0, 1.5), filters=tuple(FILTERS), methods=(("dflash", None), ("ddtree", 6)),
         n: int = 20000) -> list[Cell]:
    return [Cell(m, b, SamplingParams(temperature=t, **FILTERS[f]), n)
            for t, f, (m, b) in itertools.product(temperatures, filters, methods)]


# --- negative controls: verifiers that are wrong on purpose; a sound check must flag them ------
def wrong_temperature(engine: Engine, factor: float = 1.3) -> None:
    """Verify-pass draws use temperature x factor (a classic plumbing bug)."""
    original = engine._verify
    engine._verify = lambda batch, vin, logits: original(batch, vin, logits / factor)


def greedy_walk_sampled_bonus(engine: Engine) -> None:
    """Walk the tree with argmax draws but sample the bonus: lossy at T > 0."""
    def _verify(batch, vin, logits):
        sampled = vin.scatter(engine._sample(batch, logits, vin.spans))
        greedy = vin.scatter(logits.argmax(-1))
        out = verify_tree(vin.tokens, vin.parents, vin.depths, vin.valid, greedy, vin.max_depth)
        out.bonus = sampled.gather(1, out.last[:, None]).squeeze(1)
        return out
    engine._verify = _verify


NEGATIVE_CONTROLS = {"temperature_x1.3": wrong_temperature, "greedy_walk_sampled_bonus": greedy_walk_sampled_bonus}

__all__ = ["tiny_pair", "exact_distribution", "sample_sequences", "chi_square_pooled", "total_variation",
           "reference_tv", "Cell", "check_cell", "grid", "NEGATIVE_CONTROLS"]


def compare_with_plain(llm, n: int = 3000, prompts: list[str] | None = None, n_tokens: int = 2,
                       temperatures=(1.0,), budget: int = 16) -> list[dict]:
    """Two-sample chi-square: speculative vs plain (ar) samples of the first n_tokens on a real pair."""
    from scipy.stats import chi2_contingency
    prompts = prompts or ["def main(", "import os\n"]
    rows = []
    for prompt, T in itertools.product(prompts, temperatures):
        def counts(method, seed):
            ps = [SamplingParams(temperature=T, max_tokens=n_tokens, seed=seed + i, ignore_eos=True) for i in range(n)]
            outs = llm.generate([prompt] * n, ps, method=method, budget=budget if method == "ddtree" else None)
            return Counter(tuple(o.token_ids[:n_tokens]) for o in outs)
        plain = counts("ar", 0)
        for method in ("dflash", "ddtree"):
            spec = counts(method, 10 ** 6)
            keys = sorted(set(plain) | set(spec))
            table = np.array([[plain.get(k, 0) for k in keys], [spec.get(k, 0) for k in keys]], dtype=float)
            big = table.sum(0) >= 10  # pool sparse categories
            pooled = np.concatenate([table[:, big], table[:, ~big].sum(1, keepdims=True)], axis=1)
            pooled = pooled[:, pooled.sum(0) > 0]
            p = float(chi2_contingency(pooled)[1]) if pooled.shape[1] > 1 else 1.0
            rows.append({"prompt": prompt, "temperature": T, "method": method, "n": n, "p_value": p,
                         "categories": int(pooled.shape[1]), "passed": p > P_MIN})
    return rows
