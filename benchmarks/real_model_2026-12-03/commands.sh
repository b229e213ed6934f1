#!/usr/bin/env bash
set -x
cd /work/main
OUT=benchmarks/real_model_2026-12-03
mkdir -p $OUT
../shared/tools/quiet 120
lscpu > $OUT/lscpu.txt
for amx in 0 1; do
  FLASHTREE_AMX=$amx .venv/bin/python benchmarks/real_model_2026-12-03/measure_projections.py --model smollm2-135m-instruct --dtype bfloat16 \
    --rows 1,2,4,8,16,33 --repeats 3 --calls 5 --out $OUT/projections_bf16_amx$amx.json
done
.venv/bin/python benchmarks/real_model_2026-12-03/measure_projections.py --model smollm2-135m-instruct --dtype float32 \
    --rows 1,2,4,8,16,33 --repeats 3 --calls 5 --out $OUT/projections_fp32.json
.venv/bin/python benchmarks/real_model_2026-12-03/measure_real_model.py --repeats 2 --code 6 --general 6 --max-tokens 128 --out $OUT
for dt in float32 bfloat16; do
  .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --dtype $dt --tokens 1,2,4,8,16 \
    --modes compiled --repeats 3 --calls 20 --out $OUT/forwards_$dt.json
done
uptime
../shared/tools/quiet 60
.venv/bin/flashtree bench --model smollm2-135m-instruct --methods ar,ngram --num-prompts 8 --max-tokens 64 \
  --temperatures 0 --concurrency 1 --repeats 2 --peers hf,llama.cpp --exact-samples 0 --out $OUT/bench_peers
uptime
