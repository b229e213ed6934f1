"""C=8 T=0 hybrid@auto, a diagnostic: per engine step, drafted or plain, its phase-time sum, the
tokens it committed, and what auto predicted for it — the verdict's best rate over plain
decoding's (`ver`), the fit's predicted tau and round cost (`pred`, `pms`). It wraps the
controller's `verdict` and `fit` to log their inputs (instrumentation only; the product's code
is unchanged). Usage: python rounds_traced.py [REPEATS]"""
import json
import statistics as st
import sys
import time
from dataclasses import fields

from flashtree import LLM, SamplingParams
from flashtree.measure import bench as bm
from flashtree.speculative import adaptive as ad
from flashtree.speculative.costs import token_rates
from flashtree.train.chats import HELDOUT_CHATS
from flashtree.train.corpus import load_prompts

conc, reps = 8, int(sys.argv[1]) if len(sys.argv) > 1 else 3
llm = LLM(max_batch_size=16)
prompts = load_prompts(str(HELDOUT_CHATS))[:16]
ids = [llm.tokenizer.encode_chat(p) if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts]
base = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
eng = llm.engine

FITS = []
_fit = ad.AdaptiveBudget.fit
def fit(self, batch, trees, drafted, caught_up=0, held=0):
    out = _fit(self, batch, trees, drafted, caught_up, held)
    ch = [c for c in out[1] if c is not None and c.paths is not None]
    if ch and len(batch) == 8:
        c = self.costs
        FITS.append(dict(step=len(eng.round_log), be=round(ch[0].break_even, 2), n=max(x.nodes for x in ch), pred=round(sum(x.predicted_tau for x in ch), 1),
                         plain=round(c.round_cost(8, 1) * 1e3, 1), wide=[round(v * 1e3, 1) for v in c.round_costs(8, 8)[1:]],
                         draft=round((c.draft(drafted) or 0) * 1e3, 1), cu=caught_up))
    return out
ad.AdaptiveBudget.fit = fit

VER = {}
_verdict = ad.verdict
def verdict(seqs, states, batch, costs, catch_up, probe_every, credited):
    v = _verdict(seqs, states, batch, costs, catch_up, probe_every, credited)
    if batch == 8 and v.draft:
        curves = [ad.mean_curve(st.recent, st.calibration) for st in states]
        dc = costs.draft(batch) + costs.catch_up(catch_up)
        spec = token_rates(curves, costs, batch, dc, floor=2, fixed=batch - len(seqs))
        plain = (batch - len(seqs) + len(curves)) / costs.round_cost(batch, 1)
        T = max(spec, key=lambda x: x[1])[0]
        VER[len(eng.round_log)] = dict(best=round(max(r for _, r in spec) / plain, 2), T=T, due=sum(ad.due(st, probe_every) for st in states),
                        vgain=round(sum(c[min(T, len(c)) - 1] for c in curves), 1), vcost=round((costs.round_cost(batch, T) + dc) * 1e3, 1))
    return v
ad.verdict = verdict
eng.limit_batch(conc)
for r in range(reps + 1):
    for s in bm.slices(16, conc, 8):
        eng.reset_prefix_cache()
        eng.round_log = []
        t0 = time.perf_counter()
        outs = llm.generate([ids[i] for i in s], [base] * len(s), use_tqdm=False, method="hybrid", budget="auto")
        sec = time.perf_counter() - t0
        fits = {f['step']: f for f in FITS}
        steps, first = {}, {}
        for k, rec in enumerate(eng.round_log):
            steps.setdefault(id(rec.times), []).append(rec)
            first.setdefault(id(rec.times), k)
        plain, drafted = [], []
        for recs in steps.values():
            t = recs[0].times
            secs = sum(getattr(t, f.name) for f in fields(t)) - t.prefill
            if len(recs) < 8 or t.prefill > 0:
                continue
            tok = sum(x.tau for x in recs)
            size = max(x.tree.size for x in recs)
            pred = [x.predicted_tau for x in recs]
            f = fits.get(first[id(t)])
            (drafted if size > 1 or t.draft > 1e-3 else plain).append((secs, tok, size, pred, t.draft, t.verify_forward, f, VER.get(first[id(t)])))
        pm = st.median([p[0] for p in plain]) if plain else float('nan')
        FITS.clear()
        VER.clear()
        print(json.dumps(dict(r=r, s=s.start, sec=round(sec, 3), plain_steps=len(plain), plain_ms=round(pm * 1e3, 2),
                              drafted=[dict(ms=round(d[0] * 1e3, 1), tok=d[1], w=d[2], pred=round(sum(x or 1 for x in d[3]), 1),
                                            draft_ms=round(d[4] * 1e3, 1), fwd_ms=round(d[5] * 1e3, 1),
                                            worth=round(d[1] / (d[0] / pm), 2) if plain else None,
                                            pms=round(d[6]['be'] * d[6]['plain'], 1) if d[6] else None, ppl=d[6]['plain'] if d[6] else None, v=d[7]) for d in drafted])), flush=True)
print(json.dumps({"drift": eng.adaptive.costs.drift, "draft_s": eng.adaptive.costs.draft_s,
                  "verify8": {k[1]: round(v * 1e3, 2) for k, v in eng.adaptive.costs.verify_s.items() if k[0] == 8}}))
