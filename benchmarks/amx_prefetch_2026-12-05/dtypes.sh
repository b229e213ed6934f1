#!/usr/bin/env bash
# Session 37: plain decoding in float32 against bfloat16 (dtype auto: AMX tiles) after the tile
# changes, processes alternating fp32, bf16, twice; C=1, T=0, 8 held-out chats x 128 tokens.
# PAUSE=pid: a background job stopped (SIGSTOP) for the duration.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/amx_prefetch_2026-12-05/dtypes
mkdir -p $OUT
[ -n "$PAUSE" ] && kill -STOP "$PAUSE"
trap '[ -n "$PAUSE" ] && kill -CONT "$PAUSE"' EXIT
sleep 60
uptime | tee -a $OUT/uptime.txt
for rep in 1 2; do
  for dt in float32 bfloat16; do
    .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype $dt --precompile single --prompts chats \
      --num-prompts 8 --max-tokens 128 --methods ar --temperatures 0 --concurrency 1 --repeats 2 --no-peers \
      --exact-samples 0 --out $OUT/${dt}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
