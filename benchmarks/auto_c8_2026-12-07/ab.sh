#!/usr/bin/env bash
# Alternating processes, this checkout (new) and a worktree of the commit before (base: BASE, e.g.
# `git worktree add /tmp/base_c8 c49fa2a`): ab_slices.py at C (8) and T (0), 4 repeats after a
# warm-up, RUNS rounds of the pair. From the repository root, quiet: ../shared/tools/quiet && bash benchmarks/auto_c8_2026-12-07/ab.sh
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/c8}; mkdir -p "$OUT"
for i in ${RUNS:-1 2 3}; do
  for arm in new base; do
    if [ $arm = new ]; then src=$PWD/src; else src=${BASE:-/tmp/base_c8}/src; fi
    PYTHONPATH=$src timeout 590 .venv/bin/python benchmarks/auto_c8_2026-12-07/ab_slices.py ${C:-8} ${T:-0} 4 > $OUT/ab_${arm}_$i.jsonl 2>/dev/null
    echo "$arm $i $(tail -1 $OUT/ab_${arm}_$i.jsonl)"
  done
done
