"""Plain decoding in float32 and bfloat16 alternating in one process, chat by chat: the VM's speed
moves within minutes, so the dtypes' processes of dtypes.sh can meet different machines. Both
engines are loaded once (compiled, dtype float32 and bfloat16); each round decodes the 8 held-out
chats (C=1, T=0, 128 tokens, ignore_eos) on one engine, then on the other, the order swapped every
round. Prints tok/s per round and dtype, the per-round ratio and the ratio of the medians.

Usage: python dtypes_interleaved.py [ROUNDS, default 5]"""
import statistics
import sys
import time

from flashtree import LLM, SamplingParams
from flashtree.train.corpus import load_prompts
from flashtree.train.chats import HELDOUT_CHATS

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
chats = load_prompts(str(HELDOUT_CHATS))[:8]
params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
engines = {dt: LLM("smollm2-135m-instruct", method="ar", dtype=dt) for dt in ("float32", "bfloat16")}


def tok_s(llm) -> float:
    n, t0 = 0, time.perf_counter()
    for c in chats:
        n += len(llm.chat([c], params, use_tqdm=False)[0].token_ids)
    return n / (time.perf_counter() - t0)


for llm in engines.values():  # warm-up pass each
    tok_s(llm)
rates = {dt: [] for dt in engines}
for r in range(rounds):
    for dt in (("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32")):
        rates[dt].append(tok_s(engines[dt]))
    print(f"round {r + 1}: float32 {rates['float32'][-1]:.1f} tok/s, bfloat16 {rates['bfloat16'][-1]:.1f}, "
          f"bf16/fp32 {rates['bfloat16'][-1] / rates['float32'][-1]:.3f}", flush=True)
f, b = statistics.median(rates["float32"]), statistics.median(rates["bfloat16"])
ratios = [y / x for x, y in zip(rates["float32"], rates["bfloat16"])]
print(f"medians: float32 {f:.1f} tok/s, bfloat16 {b:.1f}; bf16/fp32 {b / f:.3f} (median of rounds "
      f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f})")
