#!/usr/bin/env bash
# Session 42, quiet machine, nothing else running: the default against plain decoding at C=8,
# T=0 and T=1 (top-p 0.95), with auto's cost table on one clock per batch; the same command as
# ../seeded_c8_2026-12-06 (issue 40: at T=1 and C=8 the default >= 0.97x plain).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/clock_c8_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
git rev-parse --short HEAD | tee $OUT/build.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ddtree --budgets auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 8 --repeats 3 --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
