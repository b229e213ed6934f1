#!/usr/bin/env bash
# Issue 58's and 59's figures on a real AMD EPYC Zen 3 (AVX2 + FMA, no AVX-512, no AMX), 2 cores:
# the machine class the issues were filed from. Sections (SECTIONS=...; each on a quiet machine,
# `../shared/tools/quiet` before it, nothing else running):
#   1  first load on empty caches (`generate`, 3 graphs) and the second load (warm caches)
#   2  forward costs, T = 1, 2, 4, 8, 16, beside the bandwidth bound (Q4_1 blocks; bf16 storage)
#   3  the default against plain decoding, 16 chats x 128 tokens, C 1/8, T 0/1
#   4  the contention figure: a CPU hog beside a chat, per thread policy
#   5  resident memory of LLM(), serve (all processes) and make demo
#   6  against llama.cpp (llama-cpp-python built here, native AVX2) on the same Q4_1 file
#   7  where a one-token step and a verify of 8 spend their time (torch.profiler, compiled)
#   8  section 3's C=8 T=0 cell alone (3 passes), and section 5 again with warm caches
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/zen3_2026-12-07
SECTIONS=${SECTIONS:-123456}
lscpu > $OUT/lscpu.txt
quiet() { ../shared/tools/quiet 120; uptime | tee -a $OUT/uptime.txt; }
if [[ $SECTIONS == *1* ]]; then
  quiet
  fresh=$(mktemp -d)
  for label in first second; do
    FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind /usr/bin/time -f "$label load: %e s, peak %M KB" \
      .venv/bin/flashtree generate --model smollm2-135m-instruct --chat "Name three prime numbers." --max-tokens 32 \
      > $OUT/generate_$label.log 2>&1
    tail -1 $OUT/generate_$label.log | tee -a $OUT/first_load.txt
  done
  rm -rf "$fresh"
fi
if [[ $SECTIONS == *2* ]]; then
  quiet
  for quant in auto none; do
    .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --quant $quant \
      --tokens 1,2,4,8,16 --modes compiled --out $OUT/forwards_$quant.json > $OUT/forwards_$quant.log 2>&1
  done
fi
if [[ $SECTIONS == *3* ]]; then
  quiet
  OUT=$OUT bash benchmarks/cpu_paths_2026-12-07/run.sh avx2 > $OUT/bench.log 2>&1
fi
if [[ $SECTIONS == *4* ]]; then
  quiet
  .venv/bin/python benchmarks/threads_2026-12-06/measure_threads.py --out $OUT/threads.json \
    --policies legacy,default,one --method hybrid --chats 4 --tokens 96 --repeats 2 > $OUT/threads.log 2>&1
fi
if [[ $SECTIONS == *5* ]]; then
  quiet
  .venv/bin/python benchmarks/memory_2026-12-06/measure_memory.py --out $OUT/memory.json > $OUT/memory.log 2>&1
fi
if [[ $SECTIONS == *6* ]]; then
  quiet
  .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 \
    --max-tokens 128 --methods ar,hybrid,ngram --budgets auto --temperatures 0 --concurrency 1 --repeats 2 \
    --peers llama.cpp --llama-cpp-weights file --exact-samples 0 --out $OUT/vs_llama_cpp > $OUT/vs_llama_cpp.log 2>&1
fi
if [[ $SECTIONS == *7* ]]; then
  quiet
  for t in 1 8; do
    .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --tokens 1,8 --modes compiled \
      --calls 50 --repeats 3 --profile 20 --profile-tokens $t --out $OUT/profile_$t.json > $OUT/profile_$t.log 2>&1
  done
fi
if [[ $SECTIONS == *8* ]]; then  # section 3's C=8 T=0 cell alone, 3 passes; section 5 again with warm caches
  quiet
  .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 --max-tokens 128 \
    --methods ar,hybrid --budgets auto --temperatures 0 --concurrency 8 --repeats 3 --no-peers --exact-samples 0 \
    --out $OUT/c8t0_rerun > $OUT/c8t0_rerun.log 2>&1
  quiet
  .venv/bin/python benchmarks/memory_2026-12-06/measure_memory.py --out $OUT/memory_warm.json > $OUT/memory_warm.log 2>&1
fi
