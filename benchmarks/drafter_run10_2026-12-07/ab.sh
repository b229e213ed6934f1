#!/usr/bin/env bash
# Three arms, alternating processes, ar and the default (hybrid, budget auto), C=1, T=0, 16
# held-out chats x 128 tokens, per path:
#   9u-bf16  run 9u's bundle ($DRAFT_9U), drafter projections bf16 (FLASHTREE_DRAFTER_QUANT=none): before
#   9u-q8    run 9u's bundle, drafter projections in q8_0 blocks (the new rule)
#   10-q8    run 10 (bundled now), q8_0 blocks: after
#   cp -r src/flashtree/bundled/smollm2-135m-instruct-drafter /tmp/drafter_9u   # before keeping run 10
#   ../shared/tools/quiet && DRAFT_9U=/tmp/drafter_9u bash benchmarks/drafter_run10_2026-12-07/ab.sh amx avx2
# ARMS="9u-bf16 9u-q8" runs those two only.
set -euo pipefail
out=benchmarks/drafter_run10_2026-12-07/ab
mkdir -p "$out"
for isa in "$@"; do
  for rep in 0 1; do
    for arm in ${ARMS:-9u-bf16 9u-q8 10-q8}; do
      draft=(); q=auto
      case $arm in 9u-*) draft=(--draft "$DRAFT_9U");; esac
      case $arm in *-bf16) q=none;; esac
      FLASHTREE_DRAFTER_QUANT=$q FLASHTREE_ISA=$isa .venv/bin/flashtree bench --model smollm2-135m-instruct "${draft[@]}" \
        --prompts chats --num-prompts 16 --max-tokens 128 --methods ar,hybrid --budgets auto --temperatures 0 \
        --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out "$out/${isa}_${arm}_$rep" > "$out/${isa}_${arm}_$rep.log" 2>&1
    done
  done
done
