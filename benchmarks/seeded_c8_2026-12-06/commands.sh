#!/usr/bin/env bash
# Session 41, on a quiet machine with nothing else running: issue 40's "T=1 and C=8: the default
# >= 0.97x plain", and T=0 C=8, after this session's seeding changes (auto's table now seeded after fixed rounds,
# before admission on an idle engine, and at the engine's batch size), default against ar only.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/seeded_c8_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ddtree --budgets auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 8 --repeats 3 --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
