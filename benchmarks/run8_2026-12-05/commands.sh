#!/usr/bin/env bash
# Session 38, on a quiet machine with training done and nothing else running, after
# scripts/keep_smollm2_drafter.sh had bundled run 8 (training/'s drafter; the bundle went back to
# run 7 afterwards):
#  1. the drafter's run 8 (18,000 chats) against run 7 (10,000), both in the bundle's bf16 +
#     draft-vocabulary form: run 7 from its bundle at 98e1b6c, copied to RUN7 (the README's
#     command, processes alternating, twice: benchmarks/run8_2026-12-05/compare_drafters.sh);
#  2. the README's command with run 8 bundled (3 repeats);
#  3. (SECTIONS has 3; not run) the README's peers command: llama.cpp on the same prompts, T 0 and 1.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run8_2026-12-05
SECTIONS=${SECTIONS:-12}
RUN7=${RUN7:-runs/run7_bundle}
if [ ! -f "$RUN7/model.safetensors" ]; then
  mkdir -p "$RUN7"
  for f in config.json draft_vocab.json model.safetensors; do
    git show "98e1b6c:src/flashtree/bundled/smollm2-135m-instruct-drafter/$f" > "$RUN7/$f"
  done
fi
lscpu > $OUT/lscpu.txt
../shared/tools/quiet 120 || exit 1
uptime | tee -a $OUT/uptime.txt
[[ $SECTIONS == *1* ]] && benchmarks/run8_2026-12-05/compare_drafters.sh $OUT run8 "" run7 "$RUN7"
[[ $SECTIONS == *2* ]] && .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 \
  --max-tokens 128 --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
  --repeats 3 --no-peers --exact-samples 0 --out $OUT/readme
uptime | tee -a $OUT/uptime.txt
[[ $SECTIONS == *3* ]] && .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 \
  --max-tokens 128 --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,auto --temperatures 0,1.0 --top-p 0.95 \
  --concurrency 1 --repeats 2 --peers llama.cpp --exact-samples 0 --out $OUT/peers
uptime | tee -a $OUT/uptime.txt
