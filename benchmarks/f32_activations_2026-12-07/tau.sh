#!/usr/bin/env bash
# τ (greedy, deterministic) of dflash and ddtree@8 on the 16 held-out chats, before and after, amx.
set -euo pipefail
out=benchmarks/f32_activations_2026-12-07
for arm in after before; do
  src=src; [ "$arm" = before ] && src=$BEFORE/src
  PYTHONPATH=$src .venv/bin/python -m flashtree.cli bench --model smollm2-135m-instruct \
    --prompts chats --num-prompts 16 --max-tokens 128 --methods dflash,ddtree --budgets 8 --temperatures 0 \
    --concurrency 1 --repeats 1 --no-peers --exact-samples 0 --out "$out/tau_$arm" > "$out/tau_$arm.log" 2>&1
done
