"""Per-round accept lengths of the free and the schema arm over the tokens their outputs share (ddtree@16, greedy).
Run from the repository root: python benchmarks/structured_2026-12-07/same_text_rounds.py"""
import sys
sys.path.insert(0, "benchmarks/structured_2026-12-06")
from bench_structured import CHATS
from flashtree import LLM, SamplingParams, StructuredOutput
llm = LLM("smollm2-135m-instruct", compile=False, max_batch_size=1)
for i in [1, 2, 5]:
    prompt, schema = CHATS[i]
    outs = {}
    for arm in ("free", "schema"):
        so = StructuredOutput(json_schema=schema) if arm == "schema" else None
        o = llm.chat([{"role": "user", "content": prompt}], SamplingParams(temperature=0, max_tokens=128, structured=so),
                     method="ddtree", budget=16)[0]
        outs[arm] = o
    f, s = outs["free"], outs["schema"]
    common = 0
    while common < min(len(f.token_ids), len(s.token_ids)) and f.token_ids[common] == s.token_ids[common]:
        common += 1
    def rounds_within(o, n):
        acc, tot = [], 0
        for a in o.metrics.accept_lengths:
            if tot + a > n: break
            acc.append(a); tot += a
        return acc
    fa, sa = rounds_within(f, common), rounds_within(s, common)
    print(i, "common", common, "of", len(f.token_ids), len(s.token_ids))
    print("  free  ", sum(fa)/max(len(fa),1), fa)
    print("  schema", sum(sa)/max(len(sa),1), sa)
