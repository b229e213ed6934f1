"""Where a one-token compiled target step's time goes: torch.profiler over 50 calls (SmolLM2, 250 cached rows).
Usage: python benchmarks/bf16_store_2026-12-05/profile_step.py [dtype]"""
import sys, time, statistics
import torch
from flashtree import LLM
dtype = sys.argv[1] if len(sys.argv) > 1 else "auto"
L0 = 250
llm = LLM(model="smollm2-135m-instruct", method="ar", dtype=dtype, compile=True)
runner, blocks = llm.engine.runner, llm.engine.blocks
slot = blocks.allocate(); blocks.reserve(slot, L0 + 40)
tok = torch.zeros(1, 1, dtype=torch.long); pos = torch.tensor([[L0]])
vis = torch.ones(1, 1, 1, dtype=torch.bool); lengths, nodes = torch.tensor([L0]), torch.arange(1)
fn = lambda: runner.run_target(tok, pos, [slot], lengths, vis, nodes)
with torch.inference_mode():
    runner.use_compiled(True)
    for _ in range(30): fn()
    ts = []
    for _ in range(200):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    print("median step ms", statistics.median(ts) * 1e3, "dtype", llm.engine.dtype)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): fn()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
