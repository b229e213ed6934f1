#!/usr/bin/env bash
# Session 39, on a quiet machine with nothing else running: the bundled pair (drafter run 8, 15,626-token
# draft vocabulary; 3de3bfa's kernels) against llama.cpp (llama-cpp-python 0.3.36, built without its
# AMX kernels, which crash on this CPU on the Q4_1 file: CMAKE_ARGS in README.md) on the same prompts
# in one run: its F32 and BF16 GGUFs of the same weights and the Q4_1 file itself, plain and prompt
# lookup; T 0 and 1 (top-p 0.95), C=1. benchmarks/run7_peers_2026-12-05/peers.sh with run 8.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run8_peers_2026-12-05
lscpu > $OUT/lscpu.txt
../shared/tools/quiet 120 || exit 1
uptime | tee -a $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 1 --repeats 2 --peers llama.cpp --exact-samples 0 --out $OUT/peers
uptime | tee -a $OUT/uptime.txt
