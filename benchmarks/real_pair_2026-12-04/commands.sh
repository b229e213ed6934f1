#!/usr/bin/env bash
# The real pair's measurements (issues 40 and 41), in this order, on a quiet machine.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/real_pair_2026-12-04
../shared/tools/quiet 300
lscpu > $OUT/lscpu.txt
uptime
.venv/bin/python -c "import torch, time; torch.set_num_threads(2); x = torch.ones(128 * 2**20); [x.sum() for _ in range(3)]
t = time.perf_counter(); [x.sum() for _ in range(10)]; print('read bandwidth GB/s (fp32 sum over 512 MB):', round(10 * x.numel() * 4 / (time.perf_counter() - t) / 1e9, 1))" | tee $OUT/bandwidth.txt
# issue 41 on the tiny pair: prefix hits for every method, the long-prompt stall, auto in a batch
../shared/tools/quiet 120
.venv/bin/python benchmarks/real_pair_2026-12-04/measure_prefix_methods.py --out $OUT/prefix_methods.json
.venv/bin/python benchmarks/paged_2026-12-04/measure_paged.py --out $OUT/paged.json
.venv/bin/python benchmarks/auto_verdict_2026-12-04/measure_auto_batch.py --out $OUT/auto_batch.json
uptime
# issue 41 first (it ran first), then issue 40's bench, as run: the planned one (all methods, T=0/0.6/1.0,
# 2 repeats, llama.cpp) needed ~35 min and llama-cpp-python had not built, so it was cut to this
../shared/tools/quiet 60
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree --budgets 16,auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out $OUT/bench
uptime
# the forward-cost table on this CPU, both dtypes (not run this session: out of time)
for dt in float32 bfloat16; do
  .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --dtype $dt --tokens 1,2,4,8,16 \
    --modes compiled --repeats 3 --calls 20 --out $OUT/forwards_$dt.json
done
uptime

# τ gap, engine vs teacher forcing (issue 40; session 28; not a speed run, taken beside a build)
python benchmarks/real_pair_2026-12-04/measure_tau_gap.py benchmarks/real_pair_2026-12-04/tau_gap.json --rows 12 \
    --drafter training/smollm2-135m-instruct-drafter/drafter   # loads as bf16, like the bundled copy
