#!/usr/bin/env bash
# Session 42, on a quiet machine with nothing else running: the default (ddtree, budget auto)
# against every fixed ddtree budget from 4 to 12 and against hybrid at the same budgets, in one
# run, C=1, T=0, with auto's cost table on one clock per batch (issue 40: the default >= 0.95x
# the best fixed config).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/auto_clock_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
git rev-parse --short HEAD | tee $OUT/build.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ddtree,hybrid --budgets 4,6,8,12,auto --temperatures 0 --concurrency 1 --repeats 3 \
  --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
