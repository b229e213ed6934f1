#!/usr/bin/env bash
# Session 30 (Intel Xeon with AMX, 2 cores), after the drafter's run on 5,000 chats, quiet machine:
#  1. the draft vocabulary against the whole head, interleaved by process (FLASHTREE_DRAFT_VOCAB=1,0,1,0:
#     the head is built at load), C=1, T=0;
#  2. the bf16 projections on AMX tiles (prefetching, at c66f016; since reverted) against vdpbf16ps, processes alternating
#     FLASHTREE_AMX=1,0,1,0 (the path is fixed per process): is a one-row step still dearer on tiles?
#  3. issue 40's one bench run: every method on held-out chats, 128 tokens, T = 0, 0.6, 1.0 (top-p
#     0.95), C = 1 and 8, dtype auto.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/drafter_5000_2026-12-04
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
for run in a b; do
  for vocab in 1 0; do
    FLASHTREE_DRAFT_VOCAB=$vocab .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats \
      --num-prompts 8 --max-tokens 128 --methods ar,dflash,ddtree --budgets 16,auto --temperatures 0 \
      --concurrency 1 --repeats 1 --no-peers --exact-samples 0 --out $OUT/vocab${vocab}_$run
    uptime | tee -a $OUT/uptime.txt
  done
done
for run in a b; do
  for amx in 1 0; do
    FLASHTREE_AMX=$amx .venv/bin/python benchmarks/real_model_2026-12-03/measure_projections.py --model smollm2-135m-instruct --dtype bfloat16 \
      --rows 1,8,17 --repeats 3 --calls 20 --out $OUT/projections_amx${amx}_$run.json
  done
done
uptime | tee -a $OUT/uptime.txt
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0,0.6,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out $OUT/bench
uptime | tee -a $OUT/uptime.txt
