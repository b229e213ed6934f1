#!/usr/bin/env bash
# Session 37: the AMX tile path of flashtree::dense_bf16 before (c57d208) and after (prefetching
# each panel's next blocks; row blocks inside the panel loop) — the same outputs bit for bit.
# OLD runs from a worktree of c57d208 (`git worktree add $EXT/wt_old c57d208`, on PYTHONPATH), NEW
# from this tree, each kernel built in its own TORCH_EXTENSIONS_DIR. Processes alternate old, new,
# old, new. PAUSE=pid: a background job stopped (SIGSTOP) for the duration.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/amx_prefetch_2026-12-05
[ -n "$PAUSE" ] && kill -STOP "$PAUSE"
trap '[ -n "$PAUSE" ] && kill -CONT "$PAUSE"' EXIT
../shared/tools/quiet 240 || echo "not quiet (a stopped job keeps its lifetime CPU share in ps)"
lscpu > $OUT/lscpu.txt
uptime | tee -a $OUT/uptime.txt
for rep in 1 2; do
  for v in old new; do
    if [ $v = old ]; then export PYTHONPATH=${EXT:-/tmp/rg}/wt_old/src; else unset PYTHONPATH; fi
    TORCH_EXTENSIONS_DIR=${EXT:-/tmp/rg}/ext_$v .venv/bin/python scripts/measure_forwards.py \
      --model smollm2-135m-instruct --tokens 1,2,4,9,17,33 --modes compiled --repeats 3 --calls 50 \
      --out $OUT/forwards_${v}_$rep.json
    TORCH_EXTENSIONS_DIR=${EXT:-/tmp/rg}/ext_$v .venv/bin/flashtree bench --model smollm2-135m-instruct \
      --prompts chats --num-prompts 8 --max-tokens 128 --methods ar,ddtree,hybrid --budgets 8,16,auto \
      --temperatures 0 --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out $OUT/bench_${v}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
