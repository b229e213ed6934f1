#!/usr/bin/env bash
# Two drafters on the real model, interleaved (A, B, A, B), on a prompt set: `flashtree bench`
# C=1, T=0, 16 chats x 128 tokens, ar / dflash / ddtree auto / hybrid auto, 2 timed repeats a
# process. Run it on a quiet machine from the repository root.
# Usage: benchmarks/user_chats_2026-12-07/compare.sh OUT PROMPTS NAME_A DRAFT_A NAME_B DRAFT_B
set -euo pipefail
out=$1; prompts=$2; names=("$3" "$5"); drafts=("$4" "$6")
mkdir -p "$out"
for rep in 1 2; do
  for i in 0 1; do
    .venv/bin/flashtree bench --model smollm2-135m-instruct --draft "${drafts[$i]}" --prompts "$prompts" \
      --num-prompts 16 --max-tokens 128 --methods ar,dflash,ddtree,hybrid --budgets auto --temperatures 0 \
      --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out "$out/${names[$i]}_$rep"
    uptime | tee -a "$out/uptime.txt"
  done
done
