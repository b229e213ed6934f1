#!/usr/bin/env bash
# Session 31 (Intel Xeon with AMX, 2 cores), after the auto verdict read recent trees and only probes
# back off (commit "auto: the verdict reads recent trees"), and prefill chunks grow from MIN_ROWS.
# The drafter's data regeneration was stopped (killed) for these and resumed after. Quiet machine.
#  1. issue 40's table: every method on 8 held-out chats x 128 tokens, C=1, T=0, 3 repeats;
#  2. the default (and hybrid, ddtree@8) at T = 0, 0.6, 1.0 (top-p 0.95), C = 1 and 8, 2 repeats;
#  3. issue 41.4: auto in a batch on the tiny pair (24 prompts x 96 tokens, max_batch_size=8, 5 repeats);
#  4. issue 41.3: the streams' largest gap while a 1,800-token default-method prompt prefills, both pairs.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/auto_verdict_2026-12-04
../shared/tools/quiet 300 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 \
  --concurrency 1 --repeats 3 --no-peers --exact-samples 0 --out $OUT/bench_c1_t0
uptime | tee -a $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ddtree,hybrid --budgets 8,auto --temperatures 0,0.6,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 2 --no-peers --exact-samples 0 --out $OUT/bench_temps
uptime | tee -a $OUT/uptime.txt
.venv/bin/python benchmarks/auto_verdict_2026-12-04/measure_auto_batch.py --out $OUT/auto_batch.json
.venv/bin/python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model smollm2-135m-instruct --out $OUT/chunked_smollm2.json
.venv/bin/python benchmarks/paged_2026-12-04/measure_paged.py --parts chunked --model tiny-code --out $OUT/chunked_tiny.json
uptime | tee -a $OUT/uptime.txt
