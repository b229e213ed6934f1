#!/usr/bin/env bash
# Session 35, on a quiet machine with nothing else running: first loads on empty caches (GGUF
# conversion + the graphs compiled at load) after the compile helper took half of every load's
# uncached graphs (compile_helper.split), with the helper (default) and without it
# (FLASHTREE_COMPILE_HELPER=0), alternating, twice:
#  1. `flashtree generate` (precompile "single": three graphs) — import to exit, 32 tokens;
#  2. `flashtree serve` (precompile "all": six graphs) — launch to the first /health 200.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run7_temps_2026-12-05
SECTIONS=${SECTIONS:-12}
../shared/tools/quiet 120 || exit 1
uptime | tee -a $OUT/uptime.txt
first_generate() {  # $1: label; env as given
  local fresh; fresh=$(mktemp -d)
  FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind /usr/bin/time -f "$1: %e s" \
    .venv/bin/flashtree generate --model smollm2-135m-instruct --chat "Name three prime numbers." --max-tokens 32 \
    > $OUT/generate_$1.log 2>&1
  tail -1 $OUT/generate_$1.log | tee -a $OUT/first_load.txt
  rm -rf "$fresh"
}
first_start() {  # $1: label; env as given
  local fresh port t0 t1
  fresh=$(mktemp -d); port=$((18000 + RANDOM % 1000))
  t0=$(date +%s.%N)
  FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind .venv/bin/flashtree serve \
    --model smollm2-135m-instruct --port $port > $OUT/serve_$1.log 2>&1 &
  local pid=$!
  until curl -sf localhost:$port/health > /dev/null; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
  t1=$(date +%s.%N)
  echo "serve $1: $(echo "$t1 - $t0" | bc) s to /health 200" | tee -a $OUT/first_load.txt
  kill $pid; wait $pid 2>/dev/null
  rm -rf "$fresh"
}
[[ $SECTIONS == *1* ]] && for rep in 1 2; do
  first_generate generate_helper_$rep
  FLASHTREE_COMPILE_HELPER=0 first_generate generate_nohelper_$rep
  uptime | tee -a $OUT/uptime.txt
done
[[ $SECTIONS == *2* ]] && for rep in 1 2; do
  first_start helper_$rep
  FLASHTREE_COMPILE_HELPER=0 first_start nohelper_$rep
  uptime | tee -a $OUT/uptime.txt
done
