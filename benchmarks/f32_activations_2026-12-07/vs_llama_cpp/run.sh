#!/usr/bin/env bash
# flashtree (ar, the default, ngram) against llama.cpp (plain and prompt lookup) on the same Q4_1
# file, per flashtree path; llama.cpp is the .venv's llama-cpp-python (AVX512/VNNI build) either way.
#   ../shared/tools/quiet && bash benchmarks/f32_activations_2026-12-07/vs_llama_cpp/run.sh amx avx2
set -euo pipefail
out=benchmarks/f32_activations_2026-12-07/vs_llama_cpp
for isa in "$@"; do
  FLASHTREE_ISA=$isa .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 \
    --max-tokens 128 --methods ar,hybrid,ngram --budgets auto --temperatures 0 --concurrency 1 --repeats 2 \
    --peers llama.cpp --llama-cpp-weights file --exact-samples 0 --out "$out/$isa" > "$out/$isa.log" 2>&1
done
