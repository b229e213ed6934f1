import json, sys, time, numpy as np
import flashtree.speculative.adaptive as A
from flashtree import LLM, SamplingParams
from flashtree.train.chats import HELDOUT_CHATS
log = []
orig = A.choose_tokens
def wrapped(curves, costs, batch, draft_cost, floor=1, fixed=0.0):
    T = orig(curves, costs, batch, draft_cost, floor, fixed)
    cost = costs.round_costs(batch, 17)
    log.append({"T": T, "curve": [float(x) for x in curves[0][:16]], "cost": cost[1:17], "draft": draft_cost})
    return T
A.choose_tokens = wrapped
cals = {}
orig_learned = A.learned
def learned2(st, tree, path, choice):
    r = orig_learned(st, tree, path, choice); cals[id(st.metrics)] = r.calibration; return r
A.learned = learned2
llm = LLM(method="hybrid", budget="auto", precompile="all")
chats = [json.loads(l)["messages"] for l in open(HELDOUT_CHATS)][:16]
sp = SamplingParams(temperature=0, max_tokens=128)
for c in chats[:2]: llm.chat([c], sp)  # warm
log.clear()
t0 = time.perf_counter(); n = 0
for c in chats:
    o = llm.chat([c], sp)[0]; n += len(o.outputs[0].token_ids) if hasattr(o, "outputs") else 0
print("secs", time.perf_counter() - t0, "rounds", len(log))
Ts = np.array([r["T"] for r in log]); print("T hist", np.bincount(Ts))
L = max(len(r["curve"]) for r in log)
curves = np.array([r["curve"] + [r["curve"][-1]] * (16 - len(r["curve"])) for r in log])
print("mean curve by N", np.round(curves.mean(0), 2))
costs = np.array([r["cost"] for r in log]); print("mean cost by T (ms)", np.round(costs.mean(0) * 1e3, 2))
print("mean draft ms", np.mean([r["draft"] for r in log]) * 1e3)

from flashtree.speculative.calibration import PRIOR_HITS, PRIOR_COUNT, BIN_CENTRES
H = sum(c.hits for c in cals.values()); N = sum(c.trials for c in cals.values())
print("bin centre p", np.round(np.exp(BIN_CENTRES), 3))
print("pooled rate ", np.round(H / np.maximum(N, 1), 3))
print("trials      ", N.astype(int))
