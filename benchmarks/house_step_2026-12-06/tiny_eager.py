"""tok/s of tiny-code (eager, float32) for ar, ddtree and hybrid (budget auto) at C=1 and C=4: 8 prompts x 64 tokens."""
import json
import statistics
import time

from flashtree import LLM, SamplingParams

llm = LLM("tiny-code", dtype="float32", compile=False, max_batch_size=4)
prompts = ["def main(", "import os\n", "class Tree:\n    def __init__(self", "for i in range(",
           "def fib(n):", "with open(path) as f:", "try:\n    import numpy", "x = [i * i for i in"]
sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
out = {}
for method in ("ar", "ddtree", "hybrid"):
    for C in (1, 4):
        llm.engine.limit_batch(C)
        llm.generate(prompts[:2], sp, use_tqdm=False, method=method)  # warm
        rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False, method=method)
            rates.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
        out[f"{method} C={C}"] = statistics.median(rates)
print(json.dumps(out))
