"""Isolated forward costs through the model runner, beside the machine's bandwidth bound.

Times `ModelRunner.run_target` for --tokens new tokens (and `run_drafter` for one block when the
model has a drafter), each against a cached context of --context rows in one sequence, eager and
compiled, interleaved over --repeats rounds of --calls calls each (median of medians). Reports each
as a multiple of the one-token target step of the same mode, and the one-token step against its
bound: the bytes of the weights a step streams over the read bandwidth measured here (float32
torch.sum over 512 MB, median of 5), measured at the start of every round and each round's step
set against its own bound. With --profile N, then the ops of N one-token steps of the
last mode under torch.profiler (where the step's time goes, op by op). Run on a quiet machine
(`../shared/tools/quiet`).

Usage: python scripts/measure_forwards.py [--model NAME|DIR] [--dtype D] [--tokens 1,9,17]
       [--context 250] [--repeats 5] [--calls 200] [--modes eager,compiled] [--out FILE.json]
       [--profile N]
"""
import argparse
import json
import statistics
import time
from pathlib import Path

from flashtree import LLM, cpu  # first: it settles the instruction path before torch loads (FLASHTREE_ISA)

# isort: split
import numpy as np
import torch

p = argparse.ArgumentParser()
p.add_argument("--context", type=int, default=250)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--calls", type=int, default=200)
p.add_argument("--out", default=None)
p.add_argument("--model", default="tiny-code")
p.add_argument("--dtype", default="auto")
p.add_argument("--quant", default="auto", help="auto | none | q8_0 | q4_0 (LLM's quant)")
p.add_argument("--tokens", default="1,9,17", help="comma list of new-token counts (1 is always timed)")
p.add_argument("--modes", default="eager,compiled")
p.add_argument("--profile", type=int, default=0, help="profile this many one-token steps of the last mode")
p.add_argument("--profile-tokens", type=int, default=1, help="profile forwards of this many tokens instead (one of --tokens)")
a = p.parse_args()


def read_bandwidth() -> float:
    x = torch.ones(512 * 2**20 // 4)
    x.sum()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        ts.append(time.perf_counter() - t0)
    return x.nbytes / statistics.median(ts)


from flashtree.models.registry import resolve  # noqa: E402

has_drafter = resolve(a.model).drafter is not None
llm = LLM(model=a.model, method="ddtree" if has_drafter else "ar", budget=8 if has_drafter else None,
          dtype=a.dtype, compile=True, quant=a.quant)
runner, blocks = llm.engine.runner, llm.engine.blocks
L0 = a.context
slot = blocks.allocate()
if not blocks.reserve(slot, L0 + 40):
    raise SystemExit("the KV cache cannot hold that context")
K, F = (llm.drafter.config.block_size, llm.drafter.fc.in_features) if has_drafter else (0, 0)


def target(T):
    tok = torch.zeros(1, T, dtype=torch.long)
    pos = (L0 + torch.arange(T))[None].contiguous()
    vis = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
    lengths, nodes = np.array([L0]), torch.arange(T)
    return lambda: runner.run_target(tok, pos, [slot], lengths, vis, nodes)


def drafter(C=4):
    blk = torch.zeros(1, K, dtype=torch.long)
    bpos = (L0 + torch.arange(K))[None].contiguous()
    ctx = torch.zeros(1, C, F, dtype=llm.engine.kv_dtype)  # target features, as the runner keeps them
    cpos = (L0 - C + torch.arange(C))[None].contiguous()
    return lambda: runner.run_drafter(blk, bpos, ctx, cpos, [slot], np.array([L0 - C]), torch.tensor([C]),
                                      torch.tensor([K]))


counts = sorted({1, *(int(t) for t in a.tokens.split(","))})
forwards = {f"target {t} token{'s' if t > 1 else ''}": target(t) for t in counts}
if has_drafter:
    forwards[f"drafter block of {K}"] = drafter()
modes = a.modes.split(",")
times = {(mode, name): [] for mode in modes for name in forwards}
bws = []  # the read bandwidth, once a round: the VM's moves from minute to minute, so each round has its own bound
with torch.inference_mode():
    for _ in range(a.repeats):
        bws.append(read_bandwidth())
        for mode in modes:
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
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:  # (the last mode's runner stays selected)
            for _ in range(a.profile):
                forwards[f"target {a.profile_tokens} token{'s' if a.profile_tokens > 1 else ''}"]()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
rows = []
for mode in modes:
    step = statistics.median(times[(mode, "target 1 token")])
    for name in forwards:
        ms = statistics.median(times[(mode, name)])
        rows.append({"mode": mode, "forward": name, "ms": ms, "x_one_token_step": ms / step})
        print(f"{mode:8} {name:20} {ms:6.3f} ms  {ms / step:5.2f}x")
bw = statistics.median(bws)
# what one step streams: float parameters and the blocks of quantized layers, each tensor once (a tied
# head is the embedding); the embedding's own rows are a lookup (counted with its tied head only)
seen = {}
for name, t in [*llm.target.named_parameters(), *llm.target.named_buffers()]:
    if name.endswith(("inv_freq", "packed", "kv_packed")) or t is None:
        continue
    if name.startswith("model.embed_tokens.") and not llm.target.config.tie_word_embeddings:
        continue
    seen[t.data_ptr()] = t.numel() * t.element_size()
weights = sum(seen.values())
bound_ms = weights / bw * 1e3
# per round: its one-token step over its own bound; reported as the median of those ratios
ratio = {m: statistics.median(t / (weights / b * 1e3) for t, b in zip(times[(m, "target 1 token")], bws))
         for m in modes}
print(f"read bandwidth {bw / 1e9:.1f} GB/s (rounds: {', '.join(f'{b / 1e9:.1f}' for b in bws)}); weights "
      f"{weights / 1e6:.0f} MB ({llm.engine.dtype}): one-token bound {bound_ms:.2f} ms; "
      + ", ".join(f"{m} {ratio[m]:.2f}x the bound (median of rounds)" for m in modes))
if a.out:
    Path(a.out).write_text(json.dumps({"settings": vars(a), "threads": torch.get_num_threads(), "rows": rows,
                                       "read_bandwidth_gbs": bw / 1e9, "read_bandwidth_rounds_gbs": [b / 1e9 for b in bws],
                                       "weight_bytes": weights, "one_token_bound_ms": bound_ms,
                                       "x_bound_median_of_rounds": ratio, "dtype": str(llm.engine.dtype),
                                       "quant": llm.quant, "isa": cpu.isa()},
                                      indent=2) + "\n")
