#!/usr/bin/env bash
# Session 41, on a quiet machine with nothing else running: the default (ddtree, budget auto)
# against the best fixed configs (hybrid@8, ddtree@8) and hybrid@auto in one run, C=1, T=0, now
# that auto's table is seeded after fixed-budget rounds too (so the drift rule runs); the same
# command as ../auto_drift_2026-12-06 (issue 40: the default >= 0.95x the best fixed config).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/auto_seeded_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ddtree,hybrid --budgets 8,auto --temperatures 0 --concurrency 1 --repeats 3 \
  --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
