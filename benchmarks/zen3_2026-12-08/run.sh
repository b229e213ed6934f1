#!/usr/bin/env bash
# Issue 58's and 59's figures on the AMD EPYC Zen 3 (AVX2 + FMA only) after the quantized kernel's
# 4 x 2 tiles (benchmarks/zen3_2026-12-08/qdense_tiles). Sections (SECTIONS=...; each on a quiet
# machine, `../shared/tools/quiet` before it, nothing else running):
#   2  forward costs of the Q4_1 target, T = 1, 2, 4, 8, 16, beside the bandwidth bound
#   3  the default against plain decoding, 16 chats x 128 tokens, C 1/8, T 0/1
#   6  against llama.cpp (llama-cpp-python built here, native AVX2) on the same Q4_1 file
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/zen3_2026-12-08
SECTIONS=${SECTIONS:-236}
lscpu > $OUT/lscpu.txt
quiet() { ../shared/tools/quiet 120; uptime | tee -a $OUT/uptime.txt; }
if [[ $SECTIONS == *2* ]]; then
  quiet
  .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --quant auto \
    --tokens 1,2,4,8,16 --modes compiled --out $OUT/forwards_auto.json > $OUT/forwards_auto.log 2>&1
fi
if [[ $SECTIONS == *3* ]]; then
  quiet
  OUT=$OUT bash benchmarks/cpu_paths_2026-12-07/run.sh avx2 > $OUT/bench.log 2>&1
fi
if [[ $SECTIONS == *6* ]]; then
  quiet
  .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 \
    --max-tokens 128 --methods ar,hybrid,ngram --budgets auto --temperatures 0 --concurrency 1 --repeats 2 \
    --peers llama.cpp --llama-cpp-weights file --exact-samples 0 --out $OUT/vs_llama_cpp > $OUT/vs_llama_cpp.log 2>&1
fi
echo "run.sh done"
