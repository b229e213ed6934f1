#!/usr/bin/env bash
# Issue 39: bf16 (dtype auto here) against fp32 plain decoding, C=1, T=0, processes alternating
# bf16, fp32, bf16, fp32 (the dtype is fixed per process). First run with the drafter's regeneration
# only stopped (SIGSTOP); rerun (RUN=quiet) after `quiet` with nothing else running: the kept figures.
set -x
cd "$(dirname "$0")/../../.."
OUT=benchmarks/auto_verdict_2026-12-04/dtype/${RUN:-first}
mkdir -p $OUT
../shared/tools/quiet 120 || exit 1
uptime | tee $OUT/uptime.txt
for run in a b; do
  for dt in bfloat16 float32; do
    .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype $dt --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar --temperatures 0 --concurrency 1 --repeats 2 --no-peers --exact-samples 0 \
      --out $OUT/${dt}_$run
    uptime | tee -a $OUT/uptime.txt
  done
done
# then bf16 on vdpbf16ps (FLASHTREE_AMX=0) against AMX tiles, alternating
for run in c d; do
  for amx in 0 1; do
    FLASHTREE_AMX=$amx .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype bfloat16 --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar --temperatures 0 --concurrency 1 --repeats 2 --no-peers --exact-samples 0 \
      --out $OUT/bfloat16_amx${amx}_$run
    uptime | tee -a $OUT/uptime.txt
  done
done
