#!/usr/bin/env bash
# The forward-cost table per instruction path (FLASHTREE_ISA forces the lower ones), dtype auto
# of each path, beside its bandwidth bound. From the repository root on a quiet machine.
set -euo pipefail
out=benchmarks/forwards_paths_2026-12-06
for isa in "$@"; do
  FLASHTREE_ISA=$isa .venv/bin/python scripts/measure_forwards.py --model smollm2-135m-instruct \
    --tokens 1,2,4,8,16 --modes compiled --repeats 3 --out "$out/path_$isa.json" > "$out/path_$isa.log" 2>&1
done
