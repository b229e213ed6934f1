"""Where a one-token compiled target step's time goes: torch.profiler over N calls."""
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
    for _ in range(3):
        ts = []
        for _ in range(200):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        print("median step ms", round(statistics.median(ts) * 1e3, 2), "dtype", llm.engine.dtype)
