#!/usr/bin/env bash
# Session 31: the drafter's run 4 (6,728 chats, 1,500 steps from run 3, lr 3e-4) against run 3, the
# README's command with each drafter, processes alternating run 4 (bundled), run 3 (--draft, a copy of
# the run-3 bundle taken before scripts/keep_smollm2_drafter.sh replaced it); quiet machine, training done.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/drafter_run4_2026-12-04
RUN3=${RUN3:-/tmp/s31/drafter_run3}
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
for which in run4 run3; do
  extra=(); [ $which = run3 ] && extra=(--draft "$RUN3")
  .venv/bin/flashtree bench --model smollm2-135m-instruct "${extra[@]}" --prompts chats --num-prompts 8 --max-tokens 128 \
    --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
    --repeats 3 --no-peers --exact-samples 0 --out $OUT/$which
  uptime | tee -a $OUT/uptime.txt
done
