#!/usr/bin/env bash
# Session 33, on a quiet machine with training done and nothing else running:
#  1. the drafter's run 6 (3 layers, grown from run 5) against run 5 (2 layers, bundled): the
#     README's command with each drafter, processes alternating run 6 (--draft), run 5, twice;
#  2. the default at T 0.6 and 1.0 (top-p 0.95), C 1 and 8, with the drafter that is bundled after 1
#     (BUNDLED_AFTER=run6 passes run 6 as --draft);
#  3. the first load of the real model on empty caches (GGUF conversion + the graphs one sequence
#     runs: LLM(precompile="single"), the default of `generate`), then a later one.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/drafter_run6_2026-12-05
RUN6=${RUN6:-runs/smollm2-drafter-r6/bundle}  # bf16 + draft vocabulary, as the bundle is made
SECTIONS=${SECTIONS:-123}
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
[[ $SECTIONS == *1* ]] && for rep in 1 2; do
  for which in run6 run5; do
    extra=(); [ $which = run6 ] && extra=(--draft "$RUN6")
    .venv/bin/flashtree bench --model smollm2-135m-instruct "${extra[@]}" --prompts chats --num-prompts 8 \
      --max-tokens 128 --methods ar,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
      --repeats 2 --no-peers --exact-samples 0 --out $OUT/${which}_$rep
    uptime | tee -a $OUT/uptime.txt
  done
done
extra=(); [ "${BUNDLED_AFTER:-run5}" = run6 ] && extra=(--draft "$RUN6")
[[ $SECTIONS == *2* ]] && .venv/bin/flashtree bench --model smollm2-135m-instruct "${extra[@]}" --prompts chats --num-prompts 8 --max-tokens 128 \
  --methods ar,dflash,ddtree --budgets 16,auto --temperatures 0.6,1.0 --top-p 0.95 \
  --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out $OUT/temps
uptime | tee -a $OUT/uptime.txt
fresh=$(mktemp -d)
[[ $SECTIONS == *3* ]] && for i in first later; do
  FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind /usr/bin/time -f "$i load + 32 tokens: %e s" \
    .venv/bin/flashtree generate --model smollm2-135m-instruct "${extra[@]}" --chat "Name three prime numbers." \
    --max-tokens 32 2>&1 | tail -2 | tee -a $OUT/load_time.txt
done
uptime | tee -a $OUT/uptime.txt
