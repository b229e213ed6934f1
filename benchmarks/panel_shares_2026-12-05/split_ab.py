"""The projections' two thread splits alternating in one process, on SmolLM2's compiled forwards
(one sequence, 250 cached rows): whole groups of panels (FT_OLD_SPLIT set; the experimental build
described in README.md reads it at each call) against near-equal shares (the kept rule). Prints the
median of per-round medians per arm and whether both arms' outputs are bit-identical.

Usage: python split_ab.py DTYPE [ROUNDS] [TOKENS, default 1,9]"""
import os
import statistics
import sys
import time

import torch

from flashtree import LLM

dtype, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
llm = LLM(model="smollm2-135m-instruct", method="ddtree", budget=8, dtype=dtype, compile=True)
runner, blocks = llm.engine.runner, llm.engine.blocks
L0 = 250
slot = blocks.allocate()
assert blocks.reserve(slot, L0 + 40)


def target(T):
    tok = torch.zeros(1, T, dtype=torch.long)
    pos = (L0 + torch.arange(T))[None].contiguous()
    vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
    lengths, nodes = torch.tensor([L0]), torch.arange(T)
    return lambda: runner.run_target(tok, pos, [slot], lengths, vis, nodes)


def first_tensor(out):
    return out if torch.is_tensor(out) else next(o for o in out if torch.is_tensor(o))


forwards = {T: target(T) for T in map(int, (sys.argv[3] if len(sys.argv) > 3 else "1,9").split(","))}
times, outs = {}, {}
with torch.inference_mode():
    for _ in range(rounds):
        for arm in ("groups", "shares"):
            if arm == "groups":
                os.environ["FT_OLD_SPLIT"] = "1"
            else:
                os.environ.pop("FT_OLD_SPLIT", None)
            for T, fn in forwards.items():
                for _ in range(20):
                    fn()
                outs[(arm, T)] = first_tensor(fn()).clone()
                ts = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                times.setdefault((arm, T), []).append(statistics.median(ts) * 1e3)
for T in forwards:
    g, s = statistics.median(times[("groups", T)]), statistics.median(times[("shares", T)])
    print(f"{dtype} T={T}: groups {g:.2f} ms, shares {s:.2f} ms, shares/groups {s / g:.3f} "
          f"(rounds {', '.join(f'{a / b:.3f}' for a, b in zip(times[('shares', T)], times[('groups', T)]))}); "
          f"outputs equal {torch.equal(outs[('groups', T)], outs[('shares', T)])}")
