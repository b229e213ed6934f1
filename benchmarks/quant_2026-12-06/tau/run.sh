#!/usr/bin/env bash
# The drafter's tau on the Q4_1 blocks against the bf16 target at fixed budgets (ddtree@16, dflash),
# 16 held-out chats x 128 tokens, T=0, one pass after a warm-up. From the repository root:
#   bash benchmarks/quant_2026-12-06/tau/run.sh
set -euo pipefail
out=benchmarks/quant_2026-12-06/tau
for quant in blocks none; do
  .venv/bin/flashtree bench --model smollm2-135m-instruct --quant $quant --prompts chats --num-prompts 16 \
    --max-tokens 128 --methods dflash,ddtree --budgets 16 --temperatures 0 --concurrency 1 --repeats 1 \
    --no-peers --exact-samples 0 --out "$out/$quant"
done
