"""What catch-up passes cost as the cost table learns them: (rows, excess ms, per-row price ms) per record, a diagnostic wrapping CostTable.record_catch_up. Usage: python catch_ups.py CONCURRENCY TEMPERATURE"""
import sys
import time
from dataclasses import replace

from flashtree import LLM, SamplingParams
from flashtree.measure import bench as bm
from flashtree.speculative import costs as C
from flashtree.train.chats import HELDOUT_CHATS
from flashtree.train.corpus import load_prompts

LOG = []
_rc = C.CostTable.record_catch_up
def rc(self, rows, secs):
    _rc(self, rows, secs)
    LOG.append((rows, round(secs * 1e3, 2), round(self.context_row_s * 1e3, 3)))
C.CostTable.record_catch_up = rc
conc, temp = int(sys.argv[1]), float(sys.argv[2])
llm = LLM(max_batch_size=16)
prompts = load_prompts(str(HELDOUT_CHATS))[:16]
ids = [llm.tokenizer.encode_chat(p) if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts]
base = SamplingParams(max_tokens=128, temperature=temp, ignore_eos=True)
eng = llm.engine
eng.limit_batch(conc)
for r in range(2):
    for s in bm.slices(16, conc, 8):
        eng.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate([ids[i] for i in s], [replace(base, seed=i) for i in s], use_tqdm=False, method="hybrid", budget="auto")
        print(r, s.start, round(time.perf_counter() - t0, 3), LOG, flush=True)
        LOG.clear()
