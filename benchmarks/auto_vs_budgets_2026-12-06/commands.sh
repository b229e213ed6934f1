#!/usr/bin/env bash
# Session 42, quiet machine, nothing else running: the default (ddtree, budget auto) against the
# best fixed ddtree budgets of ../auto_clock_2026-12-06 (6 and 8) and hybrid@8, C=1, T=0, on twice
# the held-out chats and five timed passes, to narrow the intervals of a 5 % question (issue 40:
# the default >= 0.95x the best fixed config).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/auto_vs_budgets_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
git rev-parse --short HEAD | tee $OUT/build.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 --max-tokens 128 \
  --methods ar,ddtree,hybrid --budgets 6,8,auto --temperatures 0 --concurrency 1 --repeats 5 \
  --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
