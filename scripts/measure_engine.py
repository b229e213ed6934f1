"""Engine measurements on a ~20M-parameter random qwen3 pair (issues 2 and 3).

1. Per-token greedy decode latency: flashtree `ar` vs transformers `generate` (same weights,
   batch 1), interleaved repeats, medians, ratio.
2. Verify cost curve: cost(q)/cost(1) of one tree-masked target forward over q new tokens
   on a 256-token context, q = 1, 4, 8, 16, 32, 64 (random trees).
3. Round split for ddtree budgets 8..128: draft / tree / pack / verify forward / walk / commit
   per round, and the host-side share (everything but the two model forwards).

Usage: python scripts/measure_engine.py [--out benchmarks/engine_cpu.json] [--threads 1]
"""
import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

p = argparse.ArgumentParser()
p.add_argument("--out", default="benchmarks/engine_cpu.json")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--tokens", type=int, default=64)
a = p.parse_args()
torch.set_num_threads(a.threads)

import transformers  # noqa: E402

from flashtree import SamplingParams  # noqa: E402
from flashtree.engine.engine import Engine, EngineConfig  # noqa: E402
from flashtree.engine.round import pack_trees  # noqa: E402
from flashtree.models.loader import load_drafter, load_target  # noqa: E402
from flashtree.models.target import ForwardBatch  # noqa: E402
from flashtree.spec.tree import DraftTree  # noqa: E402
from flashtree.train.drafter import DrafterRecipe, drafter_config  # noqa: E402
from flashtree.models.drafter import DFlashDrafter  # noqa: E402
from flashtree.config import DrafterConfig  # noqa: E402
from flashtree.models.loader import save_module  # noqa: E402

root = Path(tempfile.mkdtemp())
cfg = transformers.Qwen3Config(vocab_size=16384, hidden_size=384, intermediate_size=1152, num_hidden_layers=8,
                               num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                               max_position_embeddings=2048, tie_word_embeddings=True)
torch.manual_seed(0)
hf = transformers.Qwen3ForCausalLM(cfg).float().eval()
hf.save_pretrained(root / "target")
target = load_target(root / "target", dtype="float32", device="cpu")
recipe = DrafterRecipe(block_size=16, num_layers=2, target_layer_ids=[1, 4, 7])
dcfg = drafter_config(target, recipe, 16383, str(root / "drafter" / "config.json"))
save_module(DFlashDrafter(DrafterConfig.from_dict(dcfg)), dcfg, root / "drafter")
drafter = load_drafter(root / "drafter", target)
params_m = sum(p.numel() for p in target.parameters()) / 1e6
print(f"target {params_m:.1f}M params, drafter {sum(p.numel() for p in drafter.parameters()) / 1e6:.1f}M")
prompt = torch.randint(0, 16000, (128,)).tolist()
report = {"target_params_m": params_m, "threads": a.threads, "prompt_tokens": len(prompt), "new_tokens": a.tokens}

# 1. ar vs transformers generate -------------------------------------------------------------
eng = Engine(target, None, EngineConfig(method="ar", max_batch_size=1))


def ours():
    s = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True))
    while eng.has_work():
        eng.step()
    return (s.metrics.elapsed_s - s.metrics.ttft_s) / (a.tokens - 1), s.output_ids


def theirs():
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
        t1 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=a.tokens, do_sample=False, pad_token_id=0)
        t2 = time.perf_counter()
    # per-token decode time: full run minus a 1-token (prefill) run
    return ((t2 - t1) - (t1 - t0)) / (a.tokens - 1), out[0, len(prompt):].tolist()


ours(), theirs()  # warm-up
o, t = [], []
for _ in range(a.repeats):
    x, ids_o = ours()
    y, ids_t = theirs()
    o.append(x), t.append(y)
assert ids_o == ids_t, "greedy outputs differ"
report["ar_vs_transformers"] = {"flashtree_ms_per_token": 1e3 * statistics.median(o),
                                "transformers_ms_per_token": 1e3 * statistics.median(t),
                                "speedup": statistics.median(t) / statistics.median(o)}
print("ar vs transformers:", report["ar_vs_transformers"])

# 2. verify cost curve -----------------------------------------------------------------------
g = torch.Generator().manual_seed(0)


def random_tree(q):
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, q)]
    depths = [0]
    for i in range(1, q):
        depths.append(depths[parents[i]] + 1)
    return DraftTree(torch.randint(0, 16000, (q,), generator=g).tolist(), parents, depths, [0.0] * q)


eng = Engine(target, None, EngineConfig(method="ar", max_batch_size=1))
s = eng.add_request(prompt * 2, SamplingParams(temperature=0, max_tokens=2))
eng._admit()
costs = {q: [] for q in (1, 4, 8, 16, 32, 64)}
with torch.inference_mode():
    for _ in range(a.repeats * 2):
        for q in costs:
            vin = pack_trees([random_tree(q)], [s.length], "cpu")
            fb = ForwardBatch(torch.tensor([s.slot]), vin.rows, vin.mask, eng.cache)
            t0 = time.perf_counter()
            h, _ = target(vin.tokens, vin.positions, fb)
            target.logits(h)
            costs[q].append(time.perf_counter() - t0)
c1 = statistics.median(costs[1])
report["verify_cost_curve"] = {str(q): {"ms": 1e3 * statistics.median(v), "ratio": statistics.median(v) / c1}
                               for q, v in costs.items()}
print("verify cost curve:", {q: round(v["ratio"], 2) for q, v in report["verify_cost_curve"].items()})

# 3. round split per budget --------------------------------------------------------------------
split = {}
for budget in (8, 16, 32, 64, 128):
    eng = Engine(target, drafter, EngineConfig(method="ddtree", budget=budget, max_batch_size=1))
    s = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True))
    eng.step()  # prefill + first round (warm)
    eng.timings.clear()
    rounds0 = s.metrics.rounds
    while eng.has_work():
        eng.step()
    n = s.metrics.rounds - rounds0
    per = {k: 1e3 * v / n for k, v in eng.timings.items() if k != "prefill"}
    total = sum(per.values())
    host = total - per.get("draft", 0) - per.get("verify_forward", 0)
    split[str(budget)] = {"ms_per_round": per, "total_ms": total, "host_share": host / total,
                          "mean_accept_length": s.metrics.mean_accept_length}
    print(f"budget {budget}: " + " ".join(f"{k}={v:.2f}" for k, v in per.items()) + f" host={host / total:.0%}")
report["round_split_ms"] = split
Path(a.out).parent.mkdir(parents=True, exist_ok=True)
Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
print("wrote", a.out)
