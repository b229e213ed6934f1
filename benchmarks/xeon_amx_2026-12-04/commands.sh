#!/usr/bin/env bash
# Session 29's measurements on an Intel Xeon with AMX (amx_bf16, avx512_bf16), 2 cores, quiet machine:
# issue 39 (dtypes, C=8, ngram, forward costs), issue 41 (tiny-code: prefix hits per method, the
# long-prompt gaps, auto in a batch) and issue 40 (the real pair against llama.cpp), in this order.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/xeon_amx_2026-12-04
../shared/tools/quiet 300
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
.venv/bin/python -c "import torch, time, statistics; torch.set_num_threads(2); x = torch.ones(128 * 2**20); [x.sum() for _ in range(3)]
ts = []
for _ in range(5):
    t = time.perf_counter(); x.sum(); ts.append(time.perf_counter() - t)
print('read bandwidth GB/s (fp32 sum over 512 MB, median of 5):', round(x.numel() * 4 / statistics.median(ts) / 1e9, 1))" | tee $OUT/bandwidth.txt
# issue 39: float32 against bfloat16, plain and ngram, C=1 and C=8, code and general chats
.venv/bin/python benchmarks/real_model_2026-12-03/measure_real_model.py --repeats 2 --code 6 --general 6 --max-tokens 128 --out $OUT
for dt in float32 bfloat16; do
  .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --dtype $dt --tokens 1,2,4,8,16,32 \
    --modes compiled --repeats 3 --calls 20 --out $OUT/forwards_$dt.json
done
uptime | tee -a $OUT/uptime.txt
# issue 41 on the tiny pair
.venv/bin/python benchmarks/real_pair_2026-12-04/measure_prefix_methods.py --out $OUT/prefix_methods.json
.venv/bin/python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --out $OUT/paged_chunked.json
.venv/bin/python benchmarks/auto_verdict_2026-12-04/measure_auto_batch.py --repeats 5 --out $OUT/auto_batch.json
uptime | tee -a $OUT/uptime.txt
# issue 40: the real pair, every method, against llama.cpp (the peers extra) on the same prompts
../shared/tools/quiet 60
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 2 --peers llama.cpp --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
