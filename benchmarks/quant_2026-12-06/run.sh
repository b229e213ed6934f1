#!/usr/bin/env bash
# The default model's Q4_1 file kept quantized (quant auto) against its bf16 expansion (quant none):
# forward costs beside the bandwidth bound on each path, then one bench per path of plain decoding
# and the default (hybrid, budget auto) on 16 held-out chats x 128 tokens (C=1, T=0) with
# llama.cpp (llama-cpp-python, the build installed) on the very same file. From the repository
# root on a quiet machine:  ../shared/tools/quiet && bash benchmarks/quant_2026-12-06/run.sh avx2 amx
set -euo pipefail
out=benchmarks/quant_2026-12-06
lscpu > "$out/lscpu.txt"
.venv/bin/python -c "from llama_cpp import llama_cpp as l; print(l.llama_print_system_info().decode())" \
  > "$out/llama_cpp_build.txt"
for isa in "$@"; do
  for quant in auto none; do
    FLASHTREE_ISA=$isa .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --quant $quant \
      --tokens 1,2,4,8,16 --modes compiled --repeats 3 --calls 100 --out "$out/forwards_${isa}_$quant.json" \
      | tail -8 > "$out/forwards_${isa}_$quant.txt"
  done
  FLASHTREE_ISA=$isa .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 16 \
    --max-tokens 128 --methods ar,hybrid --budgets auto --temperatures 0 --concurrency 1 --repeats 2 \
    --exact-samples 0 --peers llama.cpp --llama-cpp-weights file --out "$out/bench_$isa"
done
