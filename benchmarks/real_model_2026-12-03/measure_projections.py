"""A target's projections at a few row counts: torch's GEMM (`F.linear`: MKL for float32, oneDNN
for bfloat16 on x86) against the CPU kernel (`models/cpu_dense`), interleaved in one process.

A "chain" is one forward's worth: per layer the fused q/k/v, o, fused gate/up and down
projections, then the LM head (17 products, the target's own weights). Each row count times
--calls chains per form, --repeats rounds alternating the forms, and reports medians. Run on a
quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/real_model_2026-12-03/measure_projections.py [--model tiny-code|smollm2-135m-instruct|DIR] [--dtype float32]
       [--rows 1,2,4,6,9,17,33,64,136,256] [--repeats 5] [--calls 100] [--out FILE.json]
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flashtree import LLM
from flashtree.models import cpu_dense
from flashtree.models.layers import Linear

p = argparse.ArgumentParser()
p.add_argument("--rows", default="1,2,4,6,9,17,33,64,136,256")
p.add_argument("--repeats", type=int, default=5)
p.add_argument("--calls", type=int, default=100)
p.add_argument("--out", default=None)
p.add_argument("--model", default="tiny-code")
p.add_argument("--dtype", default="float32")
a = p.parse_args()

if not cpu_dense.available():
    raise SystemExit(f"the CPU kernel is not available here: {cpu_dense.why_unavailable()}")
target = LLM(model=a.model, method="ar", dtype=a.dtype, compile=False).target
lins = [m for m in target.modules() if isinstance(m, Linear)]  # q/k/v, o, gate/up, down per layer; LM head
assert all(m.packed is not None for m in lins)
lins.sort(key=lambda m: m is target.lm_head)                   # the LM head last, as in a forward


def chain(kernel: bool, xs) -> None:
    for m, x in zip(lins, xs):
        cpu_dense.dense(x, m.weight, m.packed, None) if kernel else F.linear(x, m.weight)


results = {}
with torch.inference_mode():
    for rows in [int(r) for r in a.rows.split(",")]:
        xs = [torch.randn(rows, m.in_features).to(m.weight.dtype) for m in lins]
        times = {"F.linear": [], "kernel": []}
        for _ in range(a.repeats + 1):  # the first round warms up
            for name, kernel in (("F.linear", False), ("kernel", True)):
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    chain(kernel, xs)
                times[name].append((time.perf_counter() - t0) / a.calls * 1e3)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        results[rows] = {"F.linear_ms": med["F.linear"], "kernel_ms": med["kernel"],
                         "speedup": med["F.linear"] / med["kernel"]}
        print(f"{rows:4d} rows  F.linear {med['F.linear']:7.3f} ms  kernel {med['kernel']:7.3f} ms  "
              f"{med['F.linear'] / med['kernel']:5.2f}x")
if a.out:
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    Path(a.out).write_text(json.dumps({"machine": cpu, "dtype": a.dtype,
                                       "threads": torch.get_num_threads(), "products": len(lins),
                                       "settings": vars(a), "results": results}, indent=2))
