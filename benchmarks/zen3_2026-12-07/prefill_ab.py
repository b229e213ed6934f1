"""Prefill alone, ar against hybrid alternating in one process: the 16 held-out chats at max_tokens=1,
the prefix cache reset before each pass, 4 rounds (the first a warm-up). Usage: python prefill_ab.py"""
import statistics
import time

from flashtree import LLM, SamplingParams
from flashtree.train.chats import HELDOUT_CHATS
from flashtree.train.corpus import load_prompts

llm = LLM(max_batch_size=16)
prompts = load_prompts(str(HELDOUT_CHATS))[:16]
p = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
res = {"ar": [], "hybrid": []}
for r in range(4):
    for m in (("ar", "hybrid") if r % 2 == 0 else ("hybrid", "ar")):
        llm.engine.reset_prefix_cache()
        t = time.perf_counter()
        llm.generate([llm.tokenizer.encode_chat(c) for c in prompts], p, method=m, use_tqdm=False)
        res[m].append(time.perf_counter() - t)
for m, v in res.items():
    print(m, [round(x, 3) for x in v], "median", round(statistics.median(v[1:]), 3))
