"""The sampling pipeline against a float64 reference (every filter plan); seeding; greedy; the
inverse-CDF sampler."""
import itertools

import numpy as np
import pytest
import torch

from flashtree.models import cpu_dense
from flashtree.sampling import (
    FilterPlan,
    Uniforms,
    argmax_rows,
    logits_to_probs,
    sample,
    sample_host,
    sample_tensors,
)
from flashtree.sampling_params import SamplingParams


def reference(logits: np.ndarray, T: float, k: int, p: float, m: float) -> np.ndarray:
    """Straightforward float64 implementation of the documented rule, one row."""
    x = logits.astype(np.float64)
    if T == 0:
        out = np.zeros_like(x)
        out[np.argmax(x)] = 1.0
        return out
    probs = np.exp((x - x.max()) / T)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(len(x), dtype=bool)
    keep[order[: (k if k > 0 else len(x))]] = True
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    if p < 1:
        mass = 0.0
        for i in order:
            if not keep[i]:
                continue
            if mass >= p:
                keep[i] = False
            mass += probs[i]
        probs = np.where(keep, probs, 0.0)
    probs = np.where(probs >= m * probs.max(), probs, 0.0)
    return probs / probs.sum()


SETTINGS = list(itertools.product([0.0, 0.5, 1.0, 1.7], [0, 1, 5], [1.0, 0.9, 0.3], [0.0, 0.05, 0.3]))


def test_pipeline_matches_float64_reference_for_every_filter_combination():
    torch.manual_seed(0)
    logits = torch.randn(len(SETTINGS), 50) * 3
    T, K, P, M = (torch.tensor(c) for c in zip(*SETTINGS))
    got = logits_to_probs(logits, T.float(), K.long(), P.float(), M.float()).double().numpy()
    for r, (t, k, p, m) in enumerate(SETTINGS):
        ref = reference(logits[r].numpy(), t, k, p, m)
        assert np.abs(got[r] - ref).max() < 1e-5, (t, k, p, m)
        assert abs(got[r].sum() - 1) < 1e-5


@pytest.mark.parametrize("subset", [
    "no_filters",          # no sort at all
    "top_k_only",          # a partial topk instead of a full sort
    "mixed_k_and_none",    # rows without filters beside top-k rows
    "top_p",               # a full sort
])
def test_every_filter_plan_matches_the_reference(subset):
    keep = {"no_filters": lambda t, k, p, m: k == 0 and p == 1.0,
            "top_k_only": lambda t, k, p, m: k > 0 and p == 1.0,
            "mixed_k_and_none": lambda t, k, p, m: p == 1.0,
            "top_p": lambda t, k, p, m: p < 1.0}[subset]
    rows = [r for r in SETTINGS if keep(*r)]
    torch.manual_seed(1)
    logits = torch.randn(len(rows), 50) * 3
    T, K, P, M = (torch.tensor(c) for c in zip(*rows))
    plan = FilterPlan.of(T.tolist(), K.tolist(), P.tolist(), M.tolist(), 50)
    expected_width = {"no_filters": 0, "top_k_only": 5, "mixed_k_and_none": 5, "top_p": 50}[subset]
    assert plan.sort_width == expected_width
    got = logits_to_probs(logits, T.float(), K.long(), P.float(), M.float(), plan).double().numpy()
    for r, (t, k, p, m) in enumerate(rows):
        assert np.abs(got[r] - reference(logits[r].numpy(), t, k, p, m)).max() < 1e-5, (t, k, p, m)


def nucleus_size(logits: torch.Tensor, T: float, p: float) -> int:
    probs = (logits.double() / T).softmax(-1).sort(descending=True).values
    return int(((probs.cumsum(-1) - probs) < p).sum())


@pytest.mark.parametrize("T, p", [(0.5, 0.9), (3.0, 0.95)])
def test_a_full_vocabulary_matches_the_reference_for_short_and_long_nuclei(T, p):
    """At 4,096 tokens the host path sorts only the candidates for the nucleus (the tokens holding
    at least (1 - top_p) / V of the mass): peaked rows (T=0.5) with a few of them, flat rows (T=3)
    with thousands."""
    torch.manual_seed(2)
    V, R = 4096, 6
    logits = torch.randn(R, V) * 3
    sizes = [nucleus_size(row, T, p) for row in logits]
    assert all(n < 256 for n in sizes) if T < 1 else all(n > 256 for n in sizes), sizes
    k = torch.tensor([0, 0, 0, 100, 600, 0])
    m = torch.tensor([0.0, 0.0, 0.01, 0.0, 0.0, 0.2])
    got = logits_to_probs(logits, torch.full((R,), T), k, torch.full((R,), p), m).double().numpy()
    for r in range(R):
        ref = reference(logits[r].numpy(), T, int(k[r]), p, float(m[r]))
        assert ((got[r] > 0) == (ref > 0)).all(), r
        assert np.abs(got[r] - ref).max() < 1e-5, r


def test_tokens_tied_with_the_cut_are_all_kept():
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, torch.ones(1), torch.tensor([2]), torch.ones(1), torch.zeros(1))
    assert (probs[0] > 0).tolist() == [True, True, True, False, False]   # top-k 2 keeps both 2.0s


def test_greedy_rows_are_argmax_whatever_the_filters():
    logits = torch.randn(4, 30)
    probs = logits_to_probs(logits, torch.zeros(4), torch.tensor([0, 3, 0, 1]),
                            torch.tensor([1.0, 0.2, 0.5, 1.0]), torch.tensor([0.0, 0.5, 0.1, 0.9]))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.max(-1).values, torch.ones(4))
    assert torch.equal(sample(probs, [(0, 4)], [None]), logits.argmax(-1))


def test_seeded_sampling_reproduces_and_different_seeds_differ():
    probs = torch.full((64, 10), 0.1)
    draw = lambda seed: sample(probs, [(0, 64)], [uniform(seed, 64)])
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


def test_inverse_cdf_draws_from_probs_and_never_a_zero():
    from scipy.stats import chisquare
    p = torch.tensor([0.0, 0.5, 0.25, 0.0, 0.15, 0.1, 0.0])
    n = 40000
    draws = sample(p.expand(n, -1).clone(), [(0, n)], [uniform(0, n)])
    counts = torch.bincount(draws, minlength=7).numpy()
    assert counts[0] == counts[3] == counts[6] == 0
    live = p.numpy() > 0
    assert chisquare(counts[live], p.numpy()[live] * n).pvalue > 1e-3


def test_greedy_and_sampled_requests_share_one_call():
    probs = torch.tensor([[0.1, 0.6, 0.3]] * 6)
    draws = sample(probs, [(0, 2), (2, 5), (5, 6)], [None, uniform(3, 3), None])
    assert draws[[0, 1, 5]].tolist() == [1, 1, 1]             # greedy rows: argmax
    alone = sample(probs[2:5], [(0, 3)], [uniform(3, 3)])
    assert torch.equal(draws[2:5], alone)                     # a request's draws depend on its seed only


def host_draw(logits: torch.Tensor, settings: list[tuple], u: torch.Tensor, fn=sample_host) -> torch.Tensor:
    T, K, P, M = (np.asarray(c) for c in zip(*settings))
    return torch.from_numpy(fn(logits.numpy(), T.astype(np.float32), K.astype(np.int64), P.astype(np.float32),
                               M.astype(np.float32), u.numpy()))


HOST_SAMPLERS = [pytest.param(sample_tensors, id="tensors"), pytest.param(sample_host, id="kernel", marks=pytest.mark.skipif(
    not cpu_dense.available(), reason=f"the CPU kernels are not built here: {cpu_dense.why_unavailable()}"))]


@pytest.mark.parametrize("fn", HOST_SAMPLERS)
@pytest.mark.parametrize("V", [50, 4096, 1000])   # kernel: V % 8 != 0 (50, 1000 = 15 blocks + 40)
def test_the_host_sampler_draws_the_tensor_pipelines_tokens(V, fn):
    """The CPU engine's sampler (its kernel, and the tensor pipeline where there is none) and the
    tensor pipeline (CUDA's) give the same token for the same u, every filter combination, with -inf logits,
    greedy rows beside sampled ones."""
    torch.manual_seed(4)
    settings = SETTINGS * 8
    R = len(settings)
    logits = torch.randn(R, V) * torch.linspace(0.5, 5, R).unsqueeze(-1)
    logits[::5, : V // 3] = float("-inf")
    u = torch.rand(R, dtype=torch.float64)
    T, K, P, M = (torch.tensor(c) for c in zip(*settings))
    probs = logits_to_probs(logits, T.float(), K.long(), P.float(), M.float())
    expected = sample(probs, [(r, r + 1) for r in range(R)], [None if t == 0 else u[r:r + 1] for r, t in enumerate(T)])
    got = host_draw(logits, settings, u, fn)
    assert torch.equal(got, expected), (got != expected).nonzero().flatten()[:5]
    assert (probs.gather(-1, got.unsqueeze(-1)) > 0).all()


@pytest.mark.parametrize("fn", HOST_SAMPLERS)
def test_the_host_sampler_draws_from_the_distribution(fn):
    """Chi-square of host draws against the pipeline's probabilities (T=0.8, top-p 0.9, min-p),
    and a negative control: the same draws against the unfiltered distribution fail."""
    from scipy.stats import chisquare
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.2, -1.0, 0.9, -3.0, 1.2]])
    n = 40000
    setting = (0.8, 0, 0.9, 0.05)
    probs = logits_to_probs(logits, *(torch.tensor([c]) for c in setting))[0].double().numpy()
    draws = host_draw(logits.expand(n, -1).contiguous(), [setting] * n, torch.rand(n, dtype=torch.float64), fn)
    counts = np.bincount(draws.numpy(), minlength=8)
    live = probs > 0
    assert (counts[~live] == 0).all() and (~live).any()
    assert chisquare(counts[live], probs[live] / probs[live].sum() * n).pvalue > 1e-3
    plain = torch.softmax(logits[0].double() / 0.8, -1).numpy()
    assert chisquare(counts, plain / plain.sum() * n).pvalue < 1e-6


def test_the_inverse_cdf_edges():
    """u = 0 takes the first token with mass; u just below 1 the last; rows without valid mass
    draw V."""
    V = 3 * 256 + 5
    row = np.zeros(V, np.float32)
    row[[7, 256 + 3, V - 2]] = [0.2, 0.5, 0.3]
    probs = np.stack([row, row, np.full(V, np.nan, np.float32), np.zeros(V, np.float32), np.full(V, np.inf, np.float32)])
    u = torch.tensor([0.0, 1 - 1e-16, 0.5, 0.5, 0.5], dtype=torch.float64)
    got = sample(torch.from_numpy(probs), [(r, r + 1) for r in range(5)], [u[r:r + 1] for r in range(5)])
    assert got.tolist() == [7, V - 2, V, V, V]


def uniform(seed: int, n: int) -> torch.Tensor:
    return Uniforms(seed).at(torch.arange(n), n)


def test_uniforms_depend_on_the_seed_and_position_only():
    a, b = Uniforms(5), Uniforms(5)
    # b is read in another order and in other pieces, past a block boundary
    late = b.at(torch.tensor([130, 3, 64]), 131)
    early = b.at(torch.arange(10), 10)
    assert torch.equal(late, a.at(torch.tensor([130, 3, 64]), 131))
    assert torch.equal(early, a.at(torch.arange(10), 10))
    assert early.dtype == torch.float64 and bool(((early >= 0) & (early < 1)).all())
    assert not torch.equal(early, Uniforms(6).at(torch.arange(10), 10))
    assert len(set(a.at(torch.arange(200), 200).tolist())) == 200   # fresh values at every position
    host = Uniforms(5)
    assert host.at_host(np.array([130, 3, 64]), 131).tolist() == late.tolist()   # the host reads the same stream


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"),
    (dict(max_tokens=0), "max_tokens"), (dict(seed="x"), "seed"), (dict(stop=[""]), "stop"),
    (dict(stop_token_ids=[-1]), "stop_token_ids"), (dict(temperature="hot"), "temperature"),
])
def test_invalid_sampling_params_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


@pytest.mark.parametrize("fn", HOST_SAMPLERS)
def test_rows_without_valid_mass_draw_the_sentinel_and_greedy_rows_the_first_maximum(fn):
    """A NaN or +inf logit, or nothing but -inf, in a sampled row: V (the engine fails that
    request); greedy rows beside them: numpy's argmax (the first maximum)."""
    V = 37
    logits = torch.randn(6, V)
    logits[0, 5] = float("nan")
    logits[1, 9] = float("inf")
    logits[2] = float("-inf")
    logits[3, [4, 20]] = 50.0                  # a greedy row with a tie: the first
    logits[5, : V - 1] = float("-inf")         # one finite logit: always that token
    settings = [(1.0, 0, 1.0, 0.0)] * 3 + [(0.0, 0, 1.0, 0.0), (0.7, 3, 0.9, 0.1), (1.3, 0, 0.5, 0.0)]
    got = host_draw(logits, settings, torch.rand(6, dtype=torch.float64), fn)
    assert got[:4].tolist() == [V, V, V, 4] and 0 <= got[4] < V and got[5] == V - 1


@pytest.mark.parametrize("fn", HOST_SAMPLERS)
def test_large_and_small_top_k_with_top_p_draw_the_tensor_pipelines_tokens(fn):
    """Top-k up to 64 takes the k largest in one pass (the kernel's sorted walk), larger k a
    selection; both with and without top-p inside them, with ties at the k-th logit."""
    torch.manual_seed(5)
    V, settings = 4096, [(t, k, p, 0.0) for t in (0.6, 1.5) for k in (3, 64, 65, 300, 4095) for p in (1.0, 0.9, 0.5)]
    settings = settings * 6
    R = len(settings)
    logits = (torch.randn(R, V) * 3).round(decimals=1)   # many equal logits: ties at every cut
    u = torch.rand(R, dtype=torch.float64)
    T, K, P, M = (torch.tensor(c) for c in zip(*settings))
    probs = logits_to_probs(logits, T.float(), K.long(), P.float(), M.float())
    expected = sample(probs, [(r, r + 1) for r in range(R)], [u[r:r + 1] for r in range(R)])
    got = host_draw(logits, settings, u, fn)
    assert torch.equal(got, expected), (got != expected).nonzero().flatten()[:5]


def test_argmax_rows_of_bf16_logits_is_torchs_first_maximum():
    """The greedy draw of bf16 logits (a bf16 model's verify) goes through float32 and numpy:
    the same index as torch's argmax, the first maximum, in rows full of bf16 ties."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(33, 49152, generator=g) * 3).to(torch.bfloat16)
    x[:, 100] = x[:, 7] = x.max() + 1  # a tie at the maximum: the first one wins
    x[3] = 0.0                          # a row of one value: index 0
    got = argmax_rows(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1))
    assert got[0] == 7 and got[3] == 0
    half = x[:4].to(torch.float16)
    assert torch.equal(argmax_rows(half), half.argmax(-1))
