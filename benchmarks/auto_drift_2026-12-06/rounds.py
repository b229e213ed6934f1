import json, statistics, collections, time
from flashtree import LLM, SamplingParams
llm = LLM()
chats = [json.loads(l) for l in open("src/flashtree/data/heldout_chats.jsonl")][:6]
eng = llm.engine
p = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
for budget in ("auto", 8, "auto"):
    eng.round_log = []
    t0 = time.perf_counter()
    for c in chats:
        llm.chat([c["messages"]], p, budget=budget)
    el = time.perf_counter() - t0
    by = collections.defaultdict(list)
    for r in eng.round_log:
        if r.times is not None:
            by[len(r.tree.tokens) if hasattr(r.tree, "tokens") else r.tree.size].append(r.times.verify_forward * 1e3)
    taus = [r.tau for r in eng.round_log]
    print(f"budget {budget}: {len(chats)*128/el:.1f} tok/s, tau {sum(taus)/len(taus)+1:.2f}, rounds {len(taus)}")
    for w in sorted(by):
        xs = by[w]
        print(f"  width {w:2d}: n {len(xs):4d} median {statistics.median(xs):6.2f} mean {statistics.mean(xs):6.2f} max {max(xs):6.2f}")
    c = eng.adaptive.costs
    print("  table:", {t: round(s * 1e3, 1) for (b, t), s in sorted(c.verify_s.items()) if b == 1}, "drift", c.drift)
