"""The default method (ddtree, budget auto) against plain decoding in a batch (issue 41.4).

24 held-out prompts x 96 tokens, `generate()` of all of them at once with max_batch_size=8, T=0
and T=1, interleaved repeats in one process (compiled runner as loaded by default). Reports
median tok/s and the ratio to plain decoding, and where a step's time goes: the engine's phase
times per round (`Engine.timings`), so the controller's own cost is read directly. Run on a
quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/auto_verdict_2026-12-04/measure_auto_batch.py [--model tiny-code] [--repeats 5] [--out FILE]
"""
import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from flashtree import LLM, SamplingParams

p = argparse.ArgumentParser()
p.add_argument("--model", default="tiny-code")
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--num-prompts", type=int, default=24)
p.add_argument("--max-tokens", type=int, default=96)
p.add_argument("--out", default=None)
a = p.parse_args()
root = Path(__file__).resolve().parents[2]
prompts = [json.loads(line)["prompt"] for line in open(root / "src/flashtree/data/heldout_prompts.jsonl")][:a.num_prompts]
llm = LLM(a.model, max_batch_size=8)
eng = llm.engine
CONFIGS = [("ar", None), (llm.method, "auto" if llm.method in ("ddtree", "hybrid") else None)]
runs: dict = {}
for r in range(a.repeats + 1):  # repeat 0 warms up
    for temp in (0.0, 1.0):
        for method, budget in CONFIGS:
            params = [SamplingParams(temperature=temp, max_tokens=a.max_tokens, ignore_eos=True, seed=i)
                      for i in range(len(prompts))]
            before, rounds0 = eng.timings.as_dict(), eng.stats.rounds
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False, method=method, budget=budget)
            secs = time.perf_counter() - t0
            if not r:
                continue
            rounds = eng.stats.rounds - rounds0
            phases = {k: 1e6 * (v - before.get(k, 0.0)) / rounds for k, v in eng.timings.as_dict().items()}
            taus = [t for o in outs for t in o.metrics.accept_lengths]
            runs.setdefault((temp, method), []).append({
                "tok_s": sum(o.metrics.completion_tokens for o in outs) / secs, "rounds": rounds,
                "us_per_round": 1e6 * secs / rounds, "phase_us_per_round": phases,
                "mean_tau": sum(taus) / len(taus)})
rows = []
for temp in (0.0, 1.0):
    plain = statistics.median(x["tok_s"] for x in runs[temp, "ar"])
    for method, _ in CONFIGS:
        xs = runs[temp, method]
        phases = {k: statistics.median(x["phase_us_per_round"].get(k, 0.0) for x in xs)
                  for k in sorted({k for x in xs for k in x["phase_us_per_round"]})}
        row = {"temperature": temp, "method": method, "tok_s": statistics.median(x["tok_s"] for x in xs),
               "tok_s_runs": [x["tok_s"] for x in xs], "vs_plain": statistics.median(x["tok_s"] for x in xs) / plain,
               "us_per_round": statistics.median(x["us_per_round"] for x in xs),
               "mean_tau": statistics.median(x["mean_tau"] for x in xs), "phase_us_per_round": phases}
        rows.append(row)
        print(f"T={temp} {method:7} {row['tok_s']:8.1f} tok/s  x{row['vs_plain']:.3f} plain  tau {row['mean_tau']:.2f}  "
              f"{row['us_per_round']:.0f} us/round  " + " ".join(f"{k} {v:.0f}" for k, v in phases.items()), flush=True)
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
if a.out:
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"model": a.model, "cpu": cpu, "prompts": len(prompts), "max_tokens": a.max_tokens,
                                       "max_batch_size": 8, "repeats": a.repeats, "rows": rows}, indent=1) + "\n")
