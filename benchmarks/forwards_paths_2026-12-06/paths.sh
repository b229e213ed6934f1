#!/usr/bin/env bash
# The forward-cost table per instruction path (FLASHTREE_ISA forces the lower ones) beside its
# bandwidth bound: each argument is PATH or PATH:DTYPE (default: the path's dtype auto).
# From the repository root on a quiet machine:
#   bash benchmarks/forwards_paths_2026-12-06/paths.sh avx2 avx2:bfloat16 avx512 avx512_bf16 amx
set -euo pipefail
out=benchmarks/forwards_paths_2026-12-06
for arg in "$@"; do
  isa=${arg%%:*}; dtype=auto; [[ $arg == *:* ]] && dtype=${arg#*:}
  FLASHTREE_ISA=$isa .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct --dtype "$dtype" \
    --tokens 1,2,4,8,16 --modes compiled --repeats 3 --out "$out/path_${isa}_$dtype.json" > "$out/path_${isa}_$dtype.log" 2>&1
done
