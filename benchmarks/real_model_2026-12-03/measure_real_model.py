"""SmolLM2-135M-Instruct on this CPU: plain and n-gram decoding, float32 against bfloat16, C=1 and C=8.

Loads the model once per dtype in one process (compiled, the default), then runs held-out chats
(data/heldout_chats.jsonl: --code chats that quote code, --general that do not) for --max-tokens
tokens each (eos ignored, so every cell decodes the same count), interleaving every (dtype, method,
concurrency) cell within each repeat; tok/s is completion tokens over wall time, the median of
--repeats. Every cell's greedy tokens are checked against plain decoding's in its dtype. Also
records the first and a later load time, the CPU (lscpu model and flags) and the load average.
Run on a quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/real_model_2026-12-03/measure_real_model.py [--repeats 3] [--code 8] [--general 8] [--max-tokens 128]
       [--dtypes float32,bfloat16] [--methods ar,ngram] [--concurrency 1,8] [--out DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from flashtree import LLM, SamplingParams
from flashtree.train.chats import load_heldout

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--code", type=int, default=8)
p.add_argument("--general", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=128)
p.add_argument("--dtypes", default="float32,bfloat16")
p.add_argument("--methods", default="ar,ngram")
p.add_argument("--concurrency", default="1,8")
p.add_argument("--out", default=None)
a = p.parse_args()

rows = load_heldout()
code = [r for r in rows if r["kind"] in ("explain", "test", "edit")][:a.code]
general = [r for r in rows if r["kind"] in ("general", "summarise", "write")][:a.general]
sets = {"code": [r["messages"] for r in code], "general": [r["messages"] for r in general]}
params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)


def cpu() -> dict:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name", "").strip(), "cores": os.cpu_count(),
            "bf16_flags": [f for f in flags if "bf16" in f or f.startswith("amx")],
            "avx512": [f for f in flags if f.startswith("avx512")][:6]}


LOAD = "import time; t = time.perf_counter(); from flashtree import LLM; LLM(model='smollm2-135m-instruct', " \
       "method='ar', dtype='{}'); print(time.perf_counter() - t)"
loadavg = os.getloadavg()
loads, llms = {}, {}
for dt in a.dtypes.split(","):
    t0 = time.perf_counter()
    llms[dt] = LLM(model="smollm2-135m-instruct", method="ar", dtype=dt)
    loads[dt] = {"this_process_s": time.perf_counter() - t0}
    # a later process: the conversion, the kernel and the compiled graphs come from the caches
    done = subprocess.run([sys.executable, "-c", LOAD.format(dt)], capture_output=True, text=True)
    loads[dt]["later_process_s"] = float(done.stdout.split()[-1])
    print(f"load {dt}: {loads[dt]}", flush=True)

cells = [(dt, m, c, s) for dt in a.dtypes.split(",") for m in a.methods.split(",")
         for c in map(int, a.concurrency.split(",")) for s in sets]
times = {cell: [] for cell in cells}
tokens, exact, tau = {}, {}, {}
reference = {}
for rep in range(a.repeats + 1):  # repeat 0 warms every bucket up, untimed
    for cell in cells:
        dt, method, conc, name = cell
        llm, convs = llms[dt], sets[name]
        t0 = time.perf_counter()
        outs = []
        for i in range(0, len(convs), conc):
            outs += llm.chat(convs[i:i + conc], params, use_tqdm=False, method=method)
        wall = time.perf_counter() - t0
        ids = [o.token_ids for o in outs]
        reference.setdefault((dt, name), ids if method == "ar" else None)
        if reference[(dt, name)] is not None:
            exact[cell] = exact.get(cell, True) and ids == reference[(dt, name)]
        tokens[cell] = sum(len(x) for x in ids)
        tau[cell] = statistics.mean(o.metrics.mean_accept_length for o in outs)
        if rep:
            times[cell].append(tokens[cell] / wall)

result = []
for cell in cells:
    dt, method, conc, name = cell
    tps = statistics.median(times[cell])
    base = statistics.median(times[(dt, "ar", conc, name)])
    fp32 = statistics.median(times[("float32", method, conc, name)]) if ("float32", method, conc, name) in times else None
    result.append({"dtype": dt, "method": method, "concurrency": conc, "chats": name, "tok_s": tps,
                   "x_plain_same_dtype": tps / base, "x_float32": tps / fp32 if fp32 else None,
                   "tau": tau[cell], "exact_vs_plain": exact.get(cell), "runs": times[cell]})
    print(f"{dt:9} {method:6} C={conc} {name:8} {tps:7.1f} tok/s  x plain {tps / base:4.2f}  "
          f"x fp32 {tps / fp32 if fp32 else float('nan'):4.2f}  tau {tau[cell]:4.2f}  exact {exact.get(cell)}")
info = {"cpu": cpu(), "loadavg_before": loadavg, "settings": vars(a), "loads": loads, "cells": result,
        "python": sys.version.split()[0]}
if a.out:
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "real_model.json").write_text(json.dumps(info, indent=2) + "\n")
