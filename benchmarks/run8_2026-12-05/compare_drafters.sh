#!/usr/bin/env bash
# Two drafters on the real model, interleaved: the README's bench command (C=1, T=0, 8 held-out
# chats x 128 tokens, 2 repeats a process) with drafter A, then B, twice; each pass's table in
# OUT/<name>_<rep>, the ratios in OUT/summary.txt. A drafter "" is the bundled one. Run it on a
# quiet machine.
# Usage: benchmarks/run8_2026-12-05/compare_drafters.sh OUT NAME_A DRAFT_A NAME_B DRAFT_B
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1; names=("$2" "$4"); drafts=("$3" "$5")
for rep in 1 2; do
  for i in 0 1; do
    extra=(); [ -n "${drafts[$i]}" ] && extra=(--draft "${drafts[$i]}")
    .venv/bin/flashtree bench --model smollm2-135m-instruct "${extra[@]}" --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
      --repeats 2 --no-peers --exact-samples 0 --out "$out/${names[$i]}_$rep"
    uptime | tee -a "$out/uptime.txt"
  done
done
.venv/bin/python benchmarks/run8_2026-12-05/summarize_drafter_compare.py "$out" "${names[@]}"
