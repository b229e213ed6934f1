#!/usr/bin/env bash
# Reproduce the bundled pair (src/flashtree/bundled) from scratch, stage by stage, as it was trained.
# Every stage resumes from its checkpoint under runs/, so the script can be stopped and rerun.
# The original runs recorded 0.82 h (target) + 1.41 h (drafter) of training on 2 CPU cores, plus
# sequence regeneration; this script itself was not rerun end to end. Then: python scripts/measure_bundled.py
set -euo pipefail
cd "$(dirname "$0")/.."
FT=${FT:-.venv/bin/flashtree}
OUT=${OUT:-src/flashtree/bundled}
THREADS=${THREADS:-2}
$FT train-target --out "$OUT/target" --work runs/target --steps 1100 --resume --threads "$THREADS"
# The drafter grew in stages: each --resume continues the optimiser and restarts the cosine over the
# new --steps; --num-sequences above what is on disk regenerates only the missing sequences.
for stage in "2000 3000" "6000 6000" "12000 10000"; do
  set -- $stage
  $FT train-drafter --target "$OUT/target" --out "$OUT/drafter" --work runs/drafter \
    --block-size 8 --layers 1 --target-layer-ids 1,2,3 --anchors 16 --batch-size 8 \
    --steps "$1" --num-sequences "$2" --resume --threads "$THREADS"
done
