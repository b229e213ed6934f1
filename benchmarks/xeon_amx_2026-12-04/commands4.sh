#!/usr/bin/env bash
# AMX tiles against vdpbf16ps again, interleaved: quiet first, then processes alternating
# FLASHTREE_AMX=1,0,1,0 (the path is fixed per process), C=1, T=0, 2 repeats each, at c3018e5.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/xeon_amx_2026-12-04/amx_abab
../shared/tools/quiet 300 || exit 1
uptime | tee $OUT.uptime.txt
for run in a b; do
  for amx in 1 0; do
    FLASHTREE_AMX=$amx .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar,dflash,ddtree,hybrid --budgets auto --temperatures 0 \
      --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out $OUT/amx${amx}_$run
    uptime | tee -a $OUT.uptime.txt
  done
done
