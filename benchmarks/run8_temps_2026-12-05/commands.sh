#!/usr/bin/env bash
# Session 40, on a quiet machine with nothing else running: the bundled drafter (run 8) at
# T 0, 0.6 and 1.0 (top-p 0.95), C 1 and 8 — tau by temperature, and the default (ddtree,
# budget auto) against plain decoding where issue 40 asks for it (T=1 and C=8).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run8_temps_2026-12-05
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,dflash,ddtree --budgets 16,auto --temperatures 0,0.6,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 2 --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
