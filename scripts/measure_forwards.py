"""Isolated forward costs of the bundled pair through the model runner (issue 9's per-step targets).

Times `ModelRunner.run_target` for 1, 9 and 17 new tokens and `run_drafter` for one block, each
against a cached context of --context rows in one sequence, eager and compiled, interleaved over
--repeats rounds of --calls calls each (median of medians). Reports each as a multiple of the
one-token target step of the same mode: the issue asks for a draft pass <= 0.35x and a 9-token
verify <= 1.3x. Run on a quiet machine (`../shared/tools/quiet`).

Usage: python scripts/measure_forwards.py [--context 250] [--repeats 5] [--calls 200] [--out FILE.json]
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from flashtree import LLM

p = argparse.ArgumentParser()
p.add_argument("--context", type=int, default=250)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--calls", type=int, default=200)
p.add_argument("--out", default=None)
a = p.parse_args()

llm = LLM(method="ddtree", budget=8, compile=True)
runner, blocks = llm.engine.runner, llm.engine.blocks
L0 = a.context
slot = blocks.allocate()
if not blocks.reserve(slot, L0 + 40):
    raise SystemExit("the KV cache cannot hold that context")
K, F = llm.drafter.config.block_size, llm.drafter.fc.in_features


def target(T):
    tok = torch.zeros(1, T, dtype=torch.long)
    pos = (L0 + torch.arange(T))[None].contiguous()
    vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
    lengths, nodes = torch.tensor([L0]), torch.arange(T)
    return lambda: runner.run_target(tok, pos, [slot], lengths, vis, nodes)


def drafter(C=4):
    blk = torch.zeros(1, K, dtype=torch.long)
    bpos = (L0 + torch.arange(K))[None].contiguous()
    ctx, cpos = torch.zeros(1, C, F), (L0 - C + torch.arange(C))[None].contiguous()
    return lambda: runner.run_drafter(blk, bpos, ctx, cpos, [slot], torch.tensor([L0 - C]), torch.tensor([C]),
                                      torch.tensor([K]))


forwards = {"target 1 token": target(1), "target 9 tokens": target(9), "target 17 tokens": target(17),
            f"drafter block of {K}": drafter()}
times = {(mode, name): [] for mode in ("eager", "compiled") for name in forwards}
with torch.inference_mode():
    for _ in range(a.repeats):
        for mode in ("eager", "compiled"):
            runner.use_compiled(mode == "compiled")
            for name, fn in forwards.items():
                for _ in range(20):
                    fn()
                ts = []
                for _ in range(a.calls):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                times[(mode, name)].append(statistics.median(ts) * 1e3)
rows = []
for mode in ("eager", "compiled"):
    step = statistics.median(times[(mode, "target 1 token")])
    for name in forwards:
        ms = statistics.median(times[(mode, name)])
        rows.append({"mode": mode, "forward": name, "ms": ms, "x_one_token_step": ms / step})
        print(f"{mode:8} {name:20} {ms:6.3f} ms  {ms / step:5.2f}x")
if a.out:
    Path(a.out).write_text(json.dumps({"settings": vars(a), "threads": torch.get_num_threads(), "rows": rows},
                                      indent=2) + "\n")
