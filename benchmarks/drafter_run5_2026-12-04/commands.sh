#!/usr/bin/env bash
# Session 32, on a quiet machine with training done and nothing else running:
#  1. issue 42's before/after: the commit before this session's refactors (d049d52), the last
#     refactor (311a706, before the bf16 argmax change) and HEAD, processes alternating old, new,
#     head, twice; ar + ddtree@auto at T 0/1 and C 1/8, all with the run-4 drafter (a copy of the
#     bundle taken before run 5 replaced it);
#  2. the drafter's run 5 (10,000 chats) against run 4: the README's command with each drafter,
#     processes alternating run 5 (bundled), run 4 (--draft);
#  3. run 5 at T 0.6 and 1.0, C 1 and 8;
#  4. the first load of the real model on empty caches (GGUF conversion + graphs), then a later one.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/drafter_run5_2026-12-04
RUN4=${RUN4:-/tmp/s32/drafter_run4}
OLD=${OLD:-/tmp/flashtree-before-s32}
NEW=${NEW:-/tmp/flashtree-refactor-s32}
[ -d "$OLD" ] || git worktree add -f "$OLD" d049d52
[ -d "$NEW" ] || git worktree add -f "$NEW" 311a706
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
for rep in 1 2; do
  for which in old new head; do  # head: the refactors plus the bf16 argmax change
    src=$NEW/src; [ $which = old ] && src=$OLD/src; [ $which = head ] && src=$PWD/src
    PYTHONPATH=$src .venv/bin/python -m flashtree.cli bench --model smollm2-135m-instruct --draft "$RUN4" \
      --prompts chats --num-prompts 8 --max-tokens 128 --methods ar,ddtree --budgets auto --temperatures 0,1.0 \
      --top-p 0.95 --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out $OUT/ab42/${which}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
for which in run5 run4; do
  extra=(); [ $which = run4 ] && extra=(--draft "$RUN4")
  .venv/bin/flashtree bench --model smollm2-135m-instruct "${extra[@]}" --prompts chats --num-prompts 8 --max-tokens 128 \
    --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
    --repeats 3 --no-peers --exact-samples 0 --out $OUT/$which
  uptime | tee -a $OUT/uptime.txt
done
# run 5 at T 0.6 / 1.0 (top-p 0.95), C 1 / 8: tau by temperature and the default against plain decoding
.venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,dflash,ddtree --budgets 16,auto --temperatures 0.6,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out $OUT/run5_temps
uptime | tee -a $OUT/uptime.txt
# first load: empty flashtree and inductor caches, the default method (graphs of the target and drafter)
fresh=$(mktemp -d)
for i in first later; do
  FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind /usr/bin/time -f "$i load + 32 tokens: %e s" \
    .venv/bin/flashtree generate --model smollm2-135m-instruct --chat "Name three prime numbers." --max-tokens 32 \
    2>&1 | tail -2 | tee -a $OUT/load_time.txt
done
uptime | tee -a $OUT/uptime.txt
