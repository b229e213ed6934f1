#!/usr/bin/env bash
# Session 37, second step: tiles holding only the M rows of x when M <= 16 (a one-row step loads
# and multiplies one row, not 16 with 15 of zeros). PREV: a worktree of 77c0a17 (the first step)
# on PYTHONPATH; NEW: this tree; DOT: this tree with FLASHTREE_AMX=0 (the vdpbf16ps path).
# Processes alternate prev, new, dot, twice; each kernel built in its own TORCH_EXTENSIONS_DIR.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/amx_prefetch_2026-12-05/short_tiles
mkdir -p $OUT
[ -n "$PAUSE" ] && kill -STOP "$PAUSE"
trap '[ -n "$PAUSE" ] && kill -CONT "$PAUSE"' EXIT
sleep 60
uptime | tee -a $OUT/uptime.txt
for rep in 1 2; do
  for v in prev new dot; do
    if [ $v = prev ]; then export PYTHONPATH=${EXT:-/tmp/rg}/wt_prev/src; else unset PYTHONPATH; fi
    amx=1; [ $v = dot ] && amx=0
    FLASHTREE_AMX=$amx TORCH_EXTENSIONS_DIR=${EXT:-/tmp/rg}/ext_$([ $v = prev ] && echo prev || echo short) .venv/bin/flashtree bench \
      --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 --methods ar,ddtree,hybrid \
      --budgets 8,auto --temperatures 0 --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out $OUT/${v}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
