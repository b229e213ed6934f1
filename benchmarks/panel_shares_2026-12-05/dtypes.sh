#!/usr/bin/env bash
# Session 40: plain decoding in float32 against bfloat16 (dtype auto: AMX tiles) on b9e832d's
# kernels (near-equal panel shares), processes alternating fp32, bf16, three times; C=1, T=0,
# 8 held-out chats x 128 tokens, 3 timed passes each (the command of ../bf16_store_2026-12-05/dtypes.sh).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/panel_shares_2026-12-05/dtypes
mkdir -p $OUT
../shared/tools/quiet 180 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee -a $OUT/uptime.txt
for rep in 1 2 3; do
  for dt in float32 bfloat16; do
    .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype $dt --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar --temperatures 0 --concurrency 1 --repeats 3 --no-peers \
      --exact-samples 0 --out $OUT/${dt}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
