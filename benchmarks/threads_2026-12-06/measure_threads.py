"""Decoding speed quiet and beside a busy neighbour, per thread policy (issue 58's contention figure).

Each policy runs in its own process (OpenMP reads its wait policy when torch loads): the default
model decodes the same held-out chats quiet, then with one `python3 -c "while True: pass"` beside
it, then quiet again; passes alternate policy by policy. Prints and writes one JSON object.

    python benchmarks/threads_2026-12-06/measure_threads.py --out benchmarks/threads_2026-12-06/threads.json \
        --policies legacy,default,one --method ar --chats 4 --tokens 96 --repeats 2

Policies (environment of the child): `legacy` = libgomp's defaults and both threads fixed (the
engine before issue 58: FLASHTREE_THREAD_POLICY=fixed, GOMP_SPINCOUNT unset = 300000 spins);
`default` = flashtree's choice (cpu.py); `passive` = OMP_WAIT_POLICY=passive; `one` =
FLASHTREE_THREADS=1.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

POLICIES = {
    "legacy": {"GOMP_SPINCOUNT": "300000", "FLASHTREE_THREAD_POLICY": "fixed"},
    "default": {},
    "fixed": {"FLASHTREE_THREAD_POLICY": "fixed"},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "one": {"FLASHTREE_THREADS": "1"},
}

CHILD = r"""
import json, sys, time, subprocess
from flashtree import LLM, SamplingParams
from flashtree.train.chats import load_heldout
method, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(method=method)
chats = [c['messages'] for c in load_heldout()[:n]]
p = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.chat(chats[:1], SamplingParams(temperature=0, max_tokens=16))  # warm
def speed():  # one chat at a time (C=1)
    t = time.perf_counter(); n = sum(len(llm.chat([c], p, use_tqdm=False)[0].token_ids) for c in chats)
    return n / (time.perf_counter() - t)
quiet = speed()
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(1.0)
try:
    busy = speed()
finally:
    hog.kill(); hog.wait()
time.sleep(1.0)
after = speed()
import torch
print(json.dumps({"quiet": quiet, "busy": busy, "quiet_after": after, "threads_at_end": torch.get_num_threads()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="legacy,default,one")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--chats", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {p: [] for p in a.policies.split(",")}
    for r in range(a.repeats):
        for pol in runs:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update(POLICIES[pol])
            out = subprocess.run([sys.executable, "-c", CHILD, a.method, str(a.chats), str(a.tokens)], env=env,
                                 capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[pol].append(res)
            print(f"pass {r} {pol:8s} quiet {res['quiet']:6.1f}  busy {res['busy']:6.1f}  "
                  f"after {res['quiet_after']:6.1f} tok/s  ({res['busy'] / res['quiet']:.2f}x)", flush=True)
    summary = {p: {k: statistics.median(x[k] for x in v) for k in ("quiet", "busy", "quiet_after")}
               for p, v in runs.items()}
    for s in summary.values():
        s["busy_over_quiet"] = s["busy"] / s["quiet"]
    report = {"method": a.method, "chats": a.chats, "tokens": a.tokens, "repeats": a.repeats,
              "when": time.strftime("%Y-%m-%d %H:%M"), "runs": runs, "summary": summary}
    print(json.dumps(summary, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
