#!/usr/bin/env bash
# Session 40, on a quiet machine with nothing else running: issue 39's load times on the current
# build. 1. `flashtree serve` on empty caches (GGUF conversion + the six graphs of precompile
# "all", compile helper on), launch to the first /health 200; 2. then, on those warm caches, a
# later process's import + LLM() (the default pair), twice.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/first_load_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
fresh=$(mktemp -d); port=$((18000 + RANDOM % 1000))
export FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind
t0=$(date +%s.%N)
.venv/bin/flashtree serve --model smollm2-135m-instruct --port $port > $OUT/serve_first.log 2>&1 &
pid=$!
until curl -sf localhost:$port/health > /dev/null; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
t1=$(date +%s.%N)
echo "serve first start: $(echo "$t1 - $t0" | bc) s to /health 200" | tee $OUT/load_times.txt
kill $pid; wait $pid 2>/dev/null
uptime | tee -a $OUT/uptime.txt
for rep in 1 2; do
  .venv/bin/python -c "
import time; t0 = time.perf_counter()
from flashtree import LLM
llm = LLM()
print(f'later load $rep (import + LLM()): {time.perf_counter() - t0:.1f} s')" 2>/dev/null | tee -a $OUT/load_times.txt
done
uptime | tee -a $OUT/uptime.txt
rm -rf "$fresh"
