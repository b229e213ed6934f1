#!/usr/bin/env bash
# Second block of session 29's measurements (same machine, quiet; the drafter-data regeneration paused
# with SIGSTOP): after the ngram cost-seeding fix (b9fd7ac) and the bf16 drafter fix of
# measure_forwards.py; then the real pair against llama.cpp (rebuilt without its AMX kernels, which
# crash on this CPU: CMAKE_ARGS in the llama.cpp peer's error message).
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/xeon_amx_2026-12-04
../shared/tools/quiet 300
uptime | tee -a $OUT/uptime.txt
mkdir -p $OUT/after_ngram_fix
.venv/bin/python benchmarks/real_model_2026-12-03/measure_real_model.py --repeats 2 --code 6 --general 6 --max-tokens 128 \
  --dtypes bfloat16 --methods ar,ngram --out $OUT/after_ngram_fix
.venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --dtype bfloat16 --tokens 1,2,4,8,16,32 \
  --modes compiled --repeats 3 --calls 20 --out $OUT/forwards_bfloat16.json
.venv/bin/python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --out $OUT/paged_chunked_after.json
uptime | tee -a $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 2 --peers llama.cpp --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
