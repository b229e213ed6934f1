#!/usr/bin/env bash
# The default (hybrid, budget auto) against plain decoding on each instruction path this machine
# runs (FLASHTREE_ISA forces the lower ones), 16 held-out chats x 128 tokens, C=1 and C=8,
# T=0 and T=1, 2 timed passes after a warm-up. Each argument is PATH[:DTYPE[:QUANT]] (default:
# the path's dtype and quant auto). From the repository root on a quiet machine:
#   ../shared/tools/quiet && bash benchmarks/cpu_paths_2026-12-07/run.sh amx avx2 avx2:auto:none
set -euo pipefail
out=${OUT:-benchmarks/cpu_paths_2026-12-07}  # OUT: another folder for a rerun
lscpu > "$out/lscpu.txt"
for arg in "$@"; do
  IFS=: read -r isa dtype quant <<< "$arg"
  dtype=${dtype:-auto}; quant=${quant:-auto}
  FLASHTREE_ISA=$isa .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype "$dtype" --quant "$quant" \
    --prompts chats --num-prompts 16 --max-tokens 128 --methods ar,hybrid --budgets auto --temperatures 0,1 \
    --concurrency 1,8 --repeats 2 --no-peers --exact-samples 0 --out "$out/${isa}_${dtype}_${quant}"
done
