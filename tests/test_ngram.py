"""N-gram (prompt-lookup) drafting: the matching rule, greedy identity with plain decoding, and
exactness of sampled output (chi-square cell with a negative control)."""

import pytest

from flashtree import LLM, SamplingParams
from flashtree.engine.engine import Engine, EngineConfig, RequestError
from flashtree.measure.exactness import NEGATIVE_CONTROLS, Cell, check_cell, tiny_pair
from flashtree.speculative.ngram import Acceptance, chain_curve, ngram_match
from helpers import pin, repetitive_prompts


# ---------------------------------------------------------------- matching
def test_no_match_proposes_nothing():
    assert ngram_match([1, 2, 3, 4, 5], 3, 1, 5) == []
    assert ngram_match([7], 3, 1, 5) == []                     # nothing earlier at all
    assert ngram_match([1, 2, 9, 1, 3], 3, 2, 5) == []         # "1 3" never occurred; n=1 is below min


def test_match_at_the_very_end():
    # the earlier occurrence ends right before the suffix: its continuation is the suffix itself
    assert ngram_match([4, 5, 4, 5], 2, 1, 8) == [4, 5]
    # a continuation that runs into the end of the context is cut there, not padded
    assert ngram_match([9, 1, 2, 3, 1, 2], 2, 1, 8) == [3, 1, 2]
    assert ngram_match([9, 1, 2, 3, 1, 2], 2, 1, 2) == [3, 1]  # and at k


def test_overlapping_occurrences():
    # "a a a": the suffix "a a" occurred at 0, overlapping itself, continued by "a"
    assert ngram_match([6, 6, 6], 2, 1, 4) == [6]
    assert ngram_match([6, 6, 6, 6, 6], 3, 1, 4) == [6]         # most recent earlier "6 6 6" starts at 1
    assert ngram_match([1, 6, 6, 6, 2, 6, 6, 6], 3, 1, 4) == [2, 6, 6, 6]  # the one earlier "6 6 6"


def test_the_longest_n_wins():
    # "2 3" occurred at 1 (followed by 8); "3" alone occurred more recently (followed by 5)
    toks = [1, 2, 3, 8, 3, 5, 2, 3]
    assert ngram_match(toks, 2, 1, 1) == [8]
    assert ngram_match(toks, 1, 1, 1) == [5]
    assert ngram_match([0, 1, 2, 3, 7, 2, 3, 9, 1, 2, 3], 3, 1, 1) == [7]  # n=3 beats the later "2 3"


def test_the_most_recent_occurrence_wins():
    assert ngram_match([1, 2, 5, 1, 2, 6, 1, 2], 2, 1, 1) == [6]
    assert ngram_match([1, 2, 5, 1, 2, 6, 1, 2], 2, 1, 3) == [6, 1, 2]


# ---------------------------------------------------------------- greedy == ar
def prompts(n=16, seed=0):
    """Half random, half repetitive (so n-gram drafts are proposed and accepted)."""
    return repetitive_prompts(n, seed)


def run(target, drafter, cfgs, ps, batch, max_tokens=24):
    eng = Engine(target, drafter, EngineConfig(method="ar", max_batch_size=batch, max_model_len=160))
    pin(lambda b, t: 1e-3)(eng)  # a flat verify cost: every chain is worth verifying whole (see test_ngram_choice...)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [eng.add_request(p, params, **cfgs[i % len(cfgs)]) for i, p in enumerate(ps)]
    while eng.has_work():
        eng.step()
    assert eng.blocks.free_slots == batch
    return [s.output_ids for s in seqs], [t for s in seqs for t in s.metrics.accept_lengths], eng


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_ngram_equals_ar(models, batch):
    target, _ = models
    ps = prompts()
    ref, _, _ = run(target, None, [dict(method="ar")], ps, batch=1)
    for opts in (dict(), dict(max_ngram=1, draft_len=3), dict(max_ngram=4, min_ngram=2, draft_len=16)):
        out, taus, _ = run(target, None, [dict(method="ngram", **opts)], ps, batch=batch)
        assert out == ref, opts
        assert sum(taus) == sum(len(o) for o in out) - len(out)
    assert max(taus) > 1  # copied continuations were accepted


def test_mixed_methods_in_one_batch_equal_ar(models):
    target, drafter = models
    ps = prompts(16, seed=3)
    ref, _, _ = run(target, drafter, [dict(method="ar")], ps, batch=1)
    cfgs = [dict(method="ar"), dict(method="ngram"), dict(method="dflash", block_size=5),
            dict(method="ddtree", budget=8), dict(method="ngram", max_ngram=2, draft_len=4)]
    out, _, eng = run(target, drafter, cfgs, ps, batch=8)
    assert out == ref
    assert eng.stats.seqs_in_forwards > eng.stats.forwards  # rounds really were batched


def test_ngram_needs_no_drafter_and_refuses_tree_options(tiny_pair):
    llm = LLM(model=tiny_pair[0], method="ngram", device="cpu", dtype="float32")
    assert llm.drafter is None
    out = llm.generate([[5, 6, 7, 5, 6, 7, 5, 6]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False, max_ngram=2, draft_len=4)[0]
    assert len(out.token_ids) == 12 and out.metrics.rounds >= 1
    with pytest.raises(RequestError, match="budget applies to methods 'ddtree', 'hybrid' only.*'ngram' copies one chain"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False, budget=4)
    with pytest.raises(RequestError, match=r"min_ngram <= max_ngram"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False, max_ngram=2, min_ngram=3)
    with pytest.raises(RequestError, match=r"draft_len .* must be an integer in \[1, 256\]"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False, draft_len=0)
    with pytest.raises(RequestError, match="max_ngram applies to methods 'ngram', 'hybrid' only"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False, method="ar", max_ngram=2)
    with pytest.raises(ValueError, match="needs a DFlash drafter"):
        llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False, method="ddtree")


# ---------------------------------------------------------------- sampled output is exact
@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


# "1 2 3" recurs; what followed it (3 1 7 6) is near the target's greedy path, so n-gram chains are
# proposed from the first round on and often accepted (mean tau ~1.3 at T=1, top_k=5)
PROMPT = [1, 2, 3, 3, 1, 7, 6, 1, 2, 3]


def test_ngram_samples_match_exact_distribution(pair):
    cell = check_cell(*pair, PROMPT, Cell("ngram", None, SamplingParams(temperature=1.0, top_k=5), 20000))
    assert cell.passed, (cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)
    assert cell.mean_accept_length > 1.2  # drafts were verified and accepted


def test_a_wrong_verifier_is_caught_on_ngram_drafts(pair):
    cell = check_cell(*pair, PROMPT, Cell("ngram", None, SamplingParams(temperature=1.0, top_k=5), 20000),
                      patch=NEGATIVE_CONTROLS["temperature_x1.1"])
    assert cell.drafts_verified and cell.rejected() and not cell.passed
    assert cell.p_value < 1e-6, (cell.p_value, cell.tv, cell.tv_limit)


# ---------------------------------------------------------------- HTTP: a target-only server
@pytest.fixture(scope="module")
def server(tiny_pair):
    import socket

    from flashtree.server.app import create_app
    from serving import Running
    llm = LLM(model=tiny_pair[0], method="ngram", device="cpu", dtype="float32")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    r = Running(create_app(llm, model_name="tiny"), sock)
    yield r, llm
    r.stop()


def test_http_ngram_requests_and_schema(server):
    import httpx
    r, llm = server
    prompt = "t5 t6 t7 t5 t6 t7 t5 t6"
    ar = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                      use_tqdm=False, method="ar")[0].text

    def post(spec):
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        return httpx.post(r.base + "/v1/completions", json={**body, **({"speculative": spec} if spec else {})},
                          timeout=60)
    for spec in (None, {"method": "ngram", "max_ngram": 2, "min_ngram": 1, "draft_len": 4}, {"method": "ar"}):
        res = post(spec)
        assert res.status_code == 200 and res.json()["choices"][0]["text"] == ar, (spec, res.text)
    from flashtree.speculative.proposer import METHODS
    assert httpx.get(r.base + "/v1/models").json()["data"][0]["methods"] == list(METHODS) and "ngram" in METHODS
    for spec, message in (({"method": "ddtree"}, "needs a DFlash drafter"),
                          ({"max_ngram": 0}, "min_ngram <= max_ngram"),
                          ({"method": "beam"}, "speculative.method"),
                          ({"method": "ar", "draft_len": 3}, "draft_len applies to method 'ngram' only")):
        res = post(spec)
        assert res.status_code == 400 and message in res.json()["error"]["message"], (spec, res.text)
        assert res.json()["error"]["param"].startswith("speculative")


# ---------------------------------------------------------------- bench covers it
def test_bench_runs_ngram_on_a_target_alone(tiny_pair, tmp_path):
    import contextlib
    import io
    import json

    from flashtree.cli import main
    from flashtree.measure.bench import BenchPlan, Config, tree_size
    plan = BenchPlan(methods=["ar", "ngram", "ddtree"], budgets=[3], temperatures=[0.0], concurrency=[1])
    assert plan.configs() == [Config("ar"), Config("ngram"), Config("ddtree", 3)]  # registry order
    assert tree_size(Config("ngram"), 8, draft_len=6) == 7
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "t5 t6 t7 " * (2 + i)}) + "\n" for i in range(2)))
    argv = ["bench", "--model", str(tiny_pair[0]), "--prompts", str(prompts), "--num-prompts", "2",
            "--max-tokens", "6", "--methods", "ar,ngram", "--temperatures", "0,1", "--repeats", "1",
            "--warmup", "0", "--no-peers", "--exact-samples", "300", "--out", str(tmp_path / "out")]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    rep = json.loads((tmp_path / "out" / "bench.json").read_text())
    cells = {(c["label"], c["temperature"]): c for c in rep["cells"]}
    assert set(cells) == {("ar", 0.0), ("ngram", 0.0), ("ar", 1.0), ("ngram", 1.0)}
    assert cells["ngram", 0.0]["exact"]["check"] == "greedy identity" and cells["ngram", 0.0]["exact"]["passed"]
    assert cells["ngram", 1.0]["exact"]["check"] == "chi-square cell"
    assert "draft" not in cells["ngram", 0.0]["costs_ms"] or cells["ngram", 0.0]["costs_ms"]["draft"] == 0.0


def test_cli_generate_ngram_without_a_drafter(tiny_pair, capsys):
    import json

    from flashtree.cli import main
    argv = ["generate", "t5 t6 t7 t5 t6 t7 t5 t6", "--model", str(tiny_pair[0]), "--method", "ngram",
            "--max-ngram", "2", "--draft-len", "4", "--max-tokens", "6", "--device", "cpu", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 6 and out["metrics"]["rounds"] >= 1
    assert main(["generate", "x", "--model", str(tiny_pair[0]), "--method", "hybrid", "--device", "cpu"]) != 0
    assert "needs a drafter" in capsys.readouterr().err


def test_ngram_match_equals_a_brute_force_search():
    """The vectorised lookup == trying every n (longest first) and every earlier position (latest first)."""
    import random

    from flashtree.speculative.ngram import ngram_match

    def brute(t, mx, mn, k):
        for n in range(min(mx, len(t) - 1), mn - 1, -1):
            for s in range(len(t) - 1 - n, -1, -1):
                if t[s:s + n] == t[len(t) - n:]:
                    return t[s + n:s + n + k] if k >= 1 else []
        return []
    rng = random.Random(0)
    for _ in range(3000):
        t = [rng.randrange(rng.choice([2, 3, 20])) for _ in range(rng.randint(1, 30))]
        mn = rng.randint(1, 4)
        mx, k = rng.randint(mn, 6), rng.randint(0, 5)
        assert ngram_match(t, mx, mn, k) == brute(t, mx, mn, k), (t, mx, mn, k)


def test_ngram_chains_are_cut_to_what_pays_under_the_measured_costs(models):
    """Issue 39.5: how much of a copied chain a round verifies follows the sequence's acceptance
    and the engine's costs. Flat costs: whole chains. A verify costing 3x more per extra token
    than acceptance repays: plain rounds — and the output never changes."""
    target, _ = models
    ps = repetitive_prompts(4)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def rounds(cost):
        eng = Engine(target, None, EngineConfig(method="ngram", max_batch_size=4, max_model_len=160))
        pin(cost)(eng)
        seqs = [eng.add_request(p, params) for p in ps]
        while eng.has_work():
            eng.step()
        wide = sum(n for (m, _, t), n in eng.runner.shapes.items() if m == "target" and t > 1)
        return [s.output_ids for s in seqs], wide, [t for s in seqs for t in s.metrics.accept_lengths]
    flat_out, flat_wide, flat_taus = rounds(lambda b, t: 1e-3)
    dear_out, dear_wide, dear_taus = rounds(lambda b, t: 1e-3 * (1 + 3 * (t - 1)))
    assert flat_out == dear_out
    assert flat_wide > 5 and max(flat_taus) > 1      # whole chains verified, and accepted
    assert dear_wide <= 1 and max(dear_taus) == 1    # (a wide forward is any prefill chunk too)


def test_ngram_alone_seeds_the_costs_it_sizes_its_chains_by(models):
    """An engine serving only ngram requests times wide forwards for the cost table it sizes its
    chains by: unmeasured, a T-token forward is priced as T one-token steps, under which a copied
    chain never pays, so ngram would never draft and never measure one."""
    target, _ = models
    eng = Engine(target, None, EngineConfig(method="ngram", max_batch_size=8, max_model_len=160))  # free slots to time on
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for p in repetitive_prompts(4):
        eng.add_request(p, params)
    while eng.has_work():
        eng.step()
    widths = {t for (_, t) in eng.adaptive.costs.verify_s}
    assert widths > {1} and max(widths) >= 8, widths
    plain = Engine(target, None, EngineConfig(method="ar", max_batch_size=8, max_model_len=160))
    plain.add_request(repetitive_prompts(1)[0], params)
    while plain.has_work():
        plain.step()
    assert {t for (_, t) in plain.adaptive.costs.verify_s} == {1}  # plain decoding seeds nothing


def test_acceptance_learns_and_forgets():
    a = Acceptance()
    assert a.rate(0) == 0.5                          # the prior
    for r in range(5):
        a.update(r, drafted=4, accepted=0)           # every copy rejected at once
    assert a.rate(5) < 0.2
    assert a.rate(5 + 40) > 0.45                     # forty plain rounds later: back near the prior, so it probes
    assert chain_curve(0.5, 3) == [1.0, 1.5, 1.75, 1.875]
