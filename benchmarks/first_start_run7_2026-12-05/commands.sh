#!/usr/bin/env bash
# Session 34, on a quiet machine with training done and nothing else running:
#  1. `flashtree serve`'s first start on empty caches (GGUF conversion + all six graphs, as serve
#     compiles them at load): with the compile helper (default) and without it
#     (FLASHTREE_COMPILE_HELPER=0), alternating, twice; seconds from launch to /health 200;
#  2. (RUN7=dir) the drafter's run 7 (2 layers, 5 feature layers) against run 5 (bundled): the
#     README's command with each drafter, processes alternating, twice.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/first_start_run7_2026-12-05
SECTIONS=${SECTIONS:-12}
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee -a $OUT/uptime.txt
first_start() {  # $1: label; env as given
  local fresh port t0 t1
  fresh=$(mktemp -d); port=$((18000 + RANDOM % 1000))
  t0=$(date +%s.%N)
  FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind .venv/bin/flashtree serve \
    --model smollm2-135m-instruct --port $port > $OUT/serve_$1.log 2>&1 &
  local pid=$!
  until curl -sf localhost:$port/health > /dev/null; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
  t1=$(date +%s.%N)
  echo "$1: $(echo "$t1 - $t0" | bc) s to /health 200" | tee -a $OUT/first_start.txt
  kill $pid; wait $pid 2>/dev/null
  rm -rf "$fresh"
}
[[ $SECTIONS == *1* ]] && for rep in 1 2; do
  first_start helper_$rep
  uptime | tee -a $OUT/uptime.txt
  FLASHTREE_COMPILE_HELPER=0 first_start nohelper_$rep
  uptime | tee -a $OUT/uptime.txt
done
[[ $SECTIONS == *2* ]] && [ -n "$RUN7" ] && benchmarks/run8_2026-12-05/compare_drafters.sh $OUT run7 "$RUN7" run5 ""
#  3. the README's command with run 7 bundled (after section 2 chose it)
[[ $SECTIONS == *3* ]] && .venv/bin/flashtree bench --model smollm2-135m-instruct --prompts chats --num-prompts 8 \
  --max-tokens 128 --methods ar,ngram,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
  --repeats 3 --no-peers --exact-samples 0 --out $OUT/readme
uptime | tee -a $OUT/uptime.txt
