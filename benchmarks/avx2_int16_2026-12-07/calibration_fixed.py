import json, sys, time, numpy as np
import flashtree.speculative.hybrid as H
from flashtree.speculative.calibration import path_logprobs, Calibration, BIN_CENTRES
from flashtree import LLM, SamplingParams
from flashtree.train.chats import HELDOUT_CHATS
budget = int(sys.argv[1])
rows = []
orig = H.Hybrid.on_commit
def oc(self, seq, tree, path):
    acc = np.zeros(tree.size, bool); acc[path] = True
    rows.append((path_logprobs(tree)[1:], acc[1:], len(path)))
    return orig(self, seq, tree, path)
H.Hybrid.on_commit = oc
llm = LLM(method="hybrid", budget=budget, precompile="all")
chats = [json.loads(l)["messages"] for l in open(HELDOUT_CHATS)][:16]
sp = SamplingParams(temperature=0, max_tokens=128)
for c in chats[:2]: llm.chat([c], sp)
rows.clear()
for c in chats: llm.chat([c], sp)
lp = np.concatenate([r[0] for r in rows]); acc = np.concatenate([r[1] for r in rows])
b = Calibration.bins(lp)
print("budget", budget, "rounds", len(rows), "tau", np.mean([r[2] for r in rows]))
print("rate by bin", [round(acc[b == i].mean(), 3) if (b == i).any() else None for i in range(10)])
print("n by bin   ", [int((b == i).sum()) for i in range(10)])
print("prior      ", np.round(np.exp(BIN_CENTRES), 3).tolist())
# predicted tau from priors vs actual
print("sum exp(lp)+1 per round", np.mean([1 + np.exp(r[0]).sum() for r in rows]))
