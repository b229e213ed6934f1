"""Greedy speculative decoding (DFlash chains, DDTree trees) equals plain greedy decoding."""
import random

import numpy as np
import pytest

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig


def prompts(n=30, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(0, 95) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def run(models, method, budget=None, batch=1, ps=None, max_tokens=24, compile=False):
    target, drafter = models
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch, max_model_len=128,
                                               compile=compile))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [eng.add_request(p, params) for p in ps]
    while eng.has_work():
        eng.step()
    assert eng.blocks.free_slots == batch  # every slot returned
    return [s.output_ids for s in seqs], [s.metrics for s in seqs]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("batch", [1, 4])
def test_dflash_and_ddtree_equal_ar(models, batch, compile):
    """In the same mode: compiled speculative == compiled plain, eager == eager."""
    ps = prompts()
    ref, _ = run(models, "ar", batch=1, ps=ps, compile=compile)
    assert all(len(r) == 24 for r in ref)
    for method, budget in [("dflash", None), ("ddtree", 1), ("ddtree", 4), ("ddtree", 16), ("ddtree", 64)]:
        out, metrics = run(models, method, budget, batch=batch, ps=ps, compile=compile)
        assert out == ref, (method, budget, batch)
        taus = [t for m in metrics for t in m.accept_lengths]
        assert sum(taus) == sum(len(o) for o in out) - len(out)  # the first token comes from prefill
        if budget == 64:
            assert max(taus) > 1, "a 64-node tree over a 96-token vocab should accept something"


def test_mixed_methods_in_one_batch_equal_ar(models):
    target, drafter = models
    ps = prompts(12, seed=3)
    ref, _ = run(models, "ar", ps=ps)
    eng = Engine(target, drafter, EngineConfig(method="ar", max_batch_size=4, max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    cfgs = [("ar", None, None), ("dflash", None, 5), ("ddtree", 8, None), ("ddtree", 32, 6)]
    seqs = [eng.add_request(p, params, *cfgs[i % 4]) for i, p in enumerate(ps)]
    while eng.has_work():
        eng.step()
    assert [s.output_ids for s in seqs] == ref
    assert eng.stats.seqs_in_forwards > eng.stats.forwards  # rounds really were batched


def test_pending_context_written_flat_drafts_as_padded_does(models):
    """A pass whose pending context rows would be mostly padding writes them to the drafter
    cache first as one flat batch: the same drafts, round by round, as the padded pass, and
    greedy output still plain decoding's. (Prompts go to the drafter cache flat at prefill in
    both runs; what a pass finds pending differs per sequence by its accepted path.)"""
    target, drafter = models
    rng = random.Random(7)
    ps = [[rng.randrange(0, 95) for _ in range(n)] for n in (60, 2, 3, 50, 1, 4, 45, 2)]
    ref, _ = run(models, "ar", ps=ps)
    runs = {}
    for waste in (0, 10**9):  # flat whenever any row would be padding / never
        # prefill unpaced: the paced chunk sizes follow measured times, and the passes must pair up
        eng = Engine(target, drafter, EngineConfig(method="ddtree", budget=8, max_batch_size=4, max_model_len=128,
                                                   prefill_stall=None))
        eng.drafts.flat_context_waste = waste
        drafts = []
        eng.drafts.source = lambda seqs, eng=eng, drafts=drafts: drafts.append(eng.drafts.run(seqs)) or drafts[-1]  # (the drafts seam)
        seqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)) for p in ps]
        while eng.has_work():
            eng.step()
        flat = sum(n for (kind, *_), n in eng.runner.shapes.items() if kind == "drafter_context")
        runs[waste] = [s.output_ids for s in seqs], [s.metrics.accept_lengths for s in seqs], drafts, flat
    (out_f, tau_f, drafts_f, flat_f), (out_p, tau_p, drafts_p, flat_p) = runs[0], runs[10**9]
    assert out_f == out_p == ref
    assert tau_f == tau_p  # (rows written one place off: the drafts change and so do the taus)
    assert flat_f > flat_p and len(drafts_f) == len(drafts_p)  # (flat_p: the prompts' prefill writes)
    for f, p in zip(drafts_f, drafts_p):
        assert [s.req_id for s in f] == [s.req_id for s in p]
        for a, b in zip(f.values(), p.values()):
            assert np.allclose(a.logprobs, b.logprobs, atol=1e-5) and (a.ids[:, 0] == b.ids[:, 0]).all()


def test_kept_features_of_committed_rows_are_the_targets_features_of_those_tokens(models):
    """The drafter context a pass reads from the runner's kept features (written by prefill and
    verify forwards, moved with accepted tree nodes, one row a plain round) is, for every committed
    row of every sequence, the target's feature of that token computed afresh; and a pass writes
    exactly the rows pending since the last one."""
    import torch
    target, drafter = models
    ps = [[random.Random(i).randrange(0, 95) for _ in range(n)] for i, n in enumerate((30, 3, 12, 1, 20, 7))]
    eng = Engine(target, drafter, EngineConfig(method="ddtree", max_batch_size=4, max_model_len=128))
    cfgs = [("ddtree", 64, None), ("dflash", None, 5), ("ddtree", "auto", None), ("hybrid", 32, None)]
    seqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), *cfgs[i % 4])
            for i, p in enumerate(ps)]
    checked, wrong, eng.round_log = [], [], []  # (round_log: the trace's record of each round's accepted path)

    def source(batch):
        for s in batch:
            ids = torch.tensor((s.prompt_ids + s.output_ids)[:s.length])
            with torch.no_grad():
                _, ref = target(ids[None], torch.arange(s.length)[None], feature_layers=eng.feature_layers)
            kept = eng.runner.features_of([s.slot], np.zeros(1, dtype=np.int64), s.length)[0]
            if (kept - ref[0]).abs().max() >= 1e-4:  # (an assert here would fail only the request)
                wrong.append((s.req_id, s.length))
            checked.append(eng.drafts.pending_rows(s))
            assert checked[-1] == s.length - eng.drafts.cached_rows(s) >= 0  # (0: the prompt, written at prefill)
        return eng.drafts.run(batch)
    eng.drafts.source = source
    while eng.has_work():
        eng.step()
    assert not wrong and all(len(s.output_ids) == 24 and s.finish_reason == "length" for s in seqs)
    assert len(checked) > 40 and max(checked) > 1  # (rows pending: what the rounds since the last pass committed)
    assert any(e.path != list(range(e.tau)) for e in eng.round_log)  # accepted nodes were moved down


def test_greedy_and_seeded_runs_repeat_exactly(models):
    ps = prompts(6, seed=5)
    a, _ = run(models, "ddtree", 16, batch=3, ps=ps)
    b, _ = run(models, "ddtree", 16, batch=3, ps=ps)
    assert a == b
    target, drafter = models

    def sampled(seed):
        eng = Engine(target, drafter, EngineConfig(method="ddtree", budget=16, max_batch_size=3, max_model_len=128))
        seqs = [eng.add_request(p, SamplingParams(temperature=1.0, seed=seed + i, max_tokens=20, ignore_eos=True))
                for i, p in enumerate(ps)]
        while eng.has_work():
            eng.step()
        return [s.output_ids for s in seqs]

    assert sampled(11) == sampled(11)
    assert sampled(11) != sampled(12)


def test_stops_apply_to_committed_tokens(models):
    ps = prompts(8, seed=9)
    ref, _ = run(models, "ar", ps=ps, max_tokens=30)
    target, drafter = models
    for method in ("ar", "dflash", "ddtree"):
        budget = 32 if method == "ddtree" else None  # only a tree takes a budget
        eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=4, max_model_len=128))
        seqs = []
        for p, r in zip(ps, ref):
            stop_tok = r[10]  # stop at the first occurrence of the 11th reference token
            seqs.append((eng.add_request(p, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok])),
                         r[: r.index(stop_tok) + 1]))
        capped = [(eng.add_request(p, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)), r[:7])
                  for p, r in zip(ps, ref)]
        while eng.has_work():
            eng.step()
        for s, want in seqs:
            assert s.output_ids == want and s.finish_reason == "stop"
        for s, want in capped:
            assert s.output_ids == want and s.finish_reason == "length"
