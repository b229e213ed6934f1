#!/usr/bin/env bash
# Third block: the bf16 projections on AMX tiles (FLASHTREE_AMX=1, opt-in) against the default
# vdpbf16ps kernel, each a whole bench of its own (one process per setting: the path is chosen at
# load), C=1, T=0: does a flat verify cost make the trees pay?
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/xeon_amx_2026-12-04
for amx in 1 0; do
  FLASHTREE_AMX=$amx .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 \
    --max-tokens 128 --methods ar,ngram,dflash,ddtree,hybrid --budgets 16,auto --temperatures 0 \
    --concurrency 1 --repeats 1 --no-peers --exact-samples 0 --out $OUT/bench_amx$amx
  uptime | tee -a $OUT/uptime.txt
done
