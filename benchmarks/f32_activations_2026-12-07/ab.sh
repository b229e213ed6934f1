#!/usr/bin/env bash
# Blocks target, activations in bf16 (dtype auto today) against float32: ar and the default,
# C=1, T=0, 16 held-out chats x 128 tokens, per path, alternating processes.
#   ../shared/tools/quiet && bash benchmarks/f32_activations_2026-12-07/ab.sh amx avx2
set -euo pipefail
out=benchmarks/f32_activations_2026-12-07
lscpu > "$out/lscpu.txt"
for isa in "$@"; do
  for dtype in auto float32 auto float32; do
    n=$(ls "$out" | grep -c "^bench_${isa}_${dtype}_" || true)
    FLASHTREE_ISA=$isa .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype "$dtype" \
      --prompts chats --num-prompts 16 --max-tokens 128 --methods ar,hybrid --budgets auto --temperatures 0 \
      --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out "$out/bench_${isa}_${dtype}_$n" > "$out/bench_${isa}_${dtype}_$n.log" 2>&1
  done
done
