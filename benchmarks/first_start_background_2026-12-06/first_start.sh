#!/usr/bin/env bash
# Session 41, on a quiet machine with nothing else running: `flashtree serve`'s first start on
# empty caches (GGUF conversion + graphs), launch to the first /health 200, with the new default
# --precompile background (the one-sequence graphs at load, the batch graphs in a niced helper
# while serving) and then with --precompile all (every graph before serving), each on fresh
# caches. With background: 4 concurrent chats right after /health (batches eager while the helper
# compiles), the time the helper finishes, and the same 4 chats again after it.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/first_start_background_2026-12-06
../shared/tools/quiet 120 || exit 1
lscpu > $OUT/lscpu.txt
uptime | tee $OUT/uptime.txt
four_chats() {  # 4 concurrent 128-token greedy chats; prints the wall seconds of the slowest
  local t0=$(date +%s.%N)
  for i in 1 2 3 4; do
    curl -s -o /dev/null -w '%{http_code}\n' localhost:$port/v1/chat/completions -H 'content-type: application/json' -d "{\"model\": \"smollm2-135m-instruct\",
      \"messages\": [{\"role\": \"user\", \"content\": \"Write a Python function number $i that reverses a list.\"}],
      \"max_tokens\": 128, \"temperature\": 0, \"ignore_eos\": true}" >> $OUT/http_codes.txt &
  done
  wait
  echo "$(date +%s.%N) - $t0" | bc
}
for mode in background all; do
  fresh=$(mktemp -d); port=$((18000 + RANDOM % 1000))
  export FLASHTREE_CACHE_DIR=$fresh/ft TORCHINDUCTOR_CACHE_DIR=$fresh/ind
  t0=$(date +%s.%N)
  .venv/bin/flashtree serve --model smollm2-135m-instruct --port $port --precompile $mode > $OUT/serve_$mode.log 2>&1 &
  pid=$!
  until curl -sf localhost:$port/health > /dev/null; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
  t1=$(date +%s.%N)
  echo "$mode: first start $(echo "$t1 - $t0" | bc) s to /health 200" | tee -a $OUT/load_times.txt
  if [ $mode = background ]; then
    echo "$mode: 4 concurrent chats right after /health: $(four_chats) s" | tee -a $OUT/load_times.txt
    for k in $(seq 600); do  # (at most 10 min)
      grep -q "compile helper has finished" $OUT/serve_$mode.log && break
      sleep 1; kill -0 $pid 2>/dev/null || break
      curl -sf localhost:$port/v1/chat/completions -H 'content-type: application/json' -d '{"model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}' > /dev/null
      curl -sf localhost:$port/v1/chat/completions -H 'content-type: application/json' -d '{"model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}' > /dev/null &
      wait $!  # (not the server)
    done
    t2=$(date +%s.%N)
    echo "$mode: helper finished $(echo "$t2 - $t0" | bc) s after launch" | tee -a $OUT/load_times.txt
  fi
  echo "$mode: 4 concurrent chats, every graph compiled: $(four_chats) s" | tee -a $OUT/load_times.txt
  kill $pid; wait $pid 2>/dev/null
  rm -rf "$fresh"
  uptime | tee -a $OUT/uptime.txt
done
