"""ar against hybrid@auto on the 16 held-out chats x 128 tokens (ignore_eos, as the bench),
slice by slice (8 prompts a slice, the bench's slices), the two configurations alternating in
one process; per slice its seconds, steps and each sequence's drafted rounds.
Usage: python ab_slices.py CONCURRENCY TEMPERATURE REPEATS"""
import json
import sys
import time
from dataclasses import replace

from flashtree import LLM, SamplingParams
from flashtree.measure import bench as bm
from flashtree.measure.bench import Config
from flashtree.train.chats import HELDOUT_CHATS
from flashtree.train.corpus import load_prompts

conc = int(sys.argv[1]) if len(sys.argv) > 1 else 8
temp = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
llm = LLM(max_batch_size=16)
prompts = load_prompts(str(HELDOUT_CHATS))[:16]
ids = [llm.tokenizer.encode_chat(p) if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts]
base = SamplingParams(max_tokens=128, temperature=temp, ignore_eos=True)
params = [replace(base, seed=i) for i in range(16)]
cfgs = [Config("ar", None, None), Config("hybrid", "auto", None)]
sl = bm.slices(16, conc, 8)
tot = {}
for r in range(reps + 1):
    for cfg in bm.pass_order(cfgs, r):
        for s in sl:
            eng = llm.engine
            eng.limit_batch(conc)
            eng.reset_prefix_cache()
            eng.timings.clear()
            before = eng.stats.snapshot()
            t0 = time.perf_counter()
            outs = llm.generate([ids[i] for i in s], [params[i] for i in s], use_tqdm=False,
                                method=cfg.method, budget=cfg.budget)
            sec = time.perf_counter() - t0
            steps = eng.stats.since(before).forwards
            where = [[k for k, b in enumerate(o.metrics.budgets) if b] for o in outs]
            rec = dict(cfg=cfg.method, r=r, s=s.start, sec=round(sec, 3), steps=steps,
                       tokens=sum(o.metrics.completion_tokens for o in outs),
                       drafted_at=where, timings={k: round(v, 3) for k, v in eng.timings.as_dict().items()})
            print(json.dumps(rec), flush=True)
            if r:
                tot.setdefault(cfg.method, []).append(sec)
print({k: sum(v) for k, v in tot.items()})
