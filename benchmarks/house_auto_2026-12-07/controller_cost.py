"""Controller cost per drafting round (decide, then observe of one drafted round for C sequences):
run with PYTHONPATH=<a checkout's src> to compare two checkouts (benchmarks/house_auto_2026-12-07)."""
import sys, time, statistics
import numpy as np
from flashtree import SamplingParams
from flashtree.engine.sequence import RequestMetrics
from flashtree.speculative.adaptive import AdaptiveBudget, Choice
from flashtree.speculative.calibration import path_logprobs
from flashtree.speculative.tree import build_ddtree
class S:
    def __init__(self, i):
        self.method, self.params = "ddtree", SamplingParams(temperature=0)
        self.prompt_ids, self.output_ids, self.metrics, self.auto = [1, 2, 3 + i], [], RequestMetrics(), True
rng = np.random.default_rng(0)
lp = np.sort(np.log(rng.dirichlet(np.ones(50) * 0.3, size=4)), axis=1)[:, ::-1][:, :6].copy()
ids = np.stack([rng.permutation(50)[:6] for _ in range(4)])
tree = build_ddtree(0, lp, ids, 8)
choice = Choice(8, 2.5, path_logprobs(tree)[1:], 1.5)
out = {}
for C in (1, 4):
    ctl, seqs = AdaptiveBudget(), [S(i) for i in range(C)]
    times = []
    for rep in range(7):
        t0 = time.perf_counter()
        for r in range(500):
            for s in seqs:
                s.metrics.rounds += 1
                s.output_ids.append(100 + r)
            ctl.decide(seqs, C)
            ctl.observe([(s, tree, [0, 1, 2], choice) for s in seqs])
        times.append((time.perf_counter() - t0) / 500 * 1e6)
    out[f"C={C}"] = statistics.median(times)
print(out)
