#!/usr/bin/env bash
# Session 39: the README's bench command (every method, budgets 8, 16, auto; 3 timed passes) with the
# kernels before (18f4db9: float32 output + .to(bfloat16); attention items split only below one a
# thread) and after (3de3bfa: bf16 stores; items split to two a thread), then plain decoding in
# float32 (which neither change touches: the dtype ratio); processes alternate old, new, fp32, twice.
# OLD runs from a worktree of 18f4db9 on PYTHONPATH (`git worktree add /tmp/rg/wt_old 18f4db9`),
# each kernel built in its own TORCH_EXTENSIONS_DIR. Both bundle drafter run 8.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/bf16_store_2026-12-05/e2e
EXT=${EXT:-/tmp/rg}
[ "$(git -C $EXT/wt_old rev-parse --short HEAD)" = 18f4db9 ] || { echo "$EXT/wt_old is not 18f4db9"; exit 1; }
mkdir -p $OUT
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee -a $OUT/uptime.txt
for rep in 1 2; do
  for v in old new fp32; do
    if [ $v = old ]; then export PYTHONPATH=$EXT/wt_old/src; else unset PYTHONPATH; fi
    if [ $v = fp32 ]; then
      TORCH_EXTENSIONS_DIR=$EXT/ext_new .venv/bin/flashtree bench --model smollm2-135m-instruct --dtype float32 \
        --prompts chats --num-prompts 8 --max-tokens 128 --methods ar --temperatures 0 --concurrency 1 \
        --repeats 3 --no-peers --exact-samples 0 --out $OUT/fp32_$rep
    else
      TORCH_EXTENSIONS_DIR=$EXT/ext_$v .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats \
        --num-prompts 8 --max-tokens 128 --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto \
        --temperatures 0 --concurrency 1 --repeats 3 --no-peers --exact-samples 0 --out $OUT/${v}_$rep
    fi
    uptime | tee -a $OUT/uptime.txt
  done
done
.venv/bin/python benchmarks/run8_2026-12-05/summarize_drafter_compare.py $OUT new old
