#!/usr/bin/env bash
# Reproduces the SmolLM2-135M-Instruct drafter (bundled/smollm2-135m-instruct-drafter): data from
# the target's own answers to stdlib chat requests, then DFlash training; resumable — run it again
# to continue where the last run stopped (RESUME=0 starts over in a fresh WORK).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/smollm2-drafter}
mkdir -p "$WORK"
resume=()
[ -f "$WORK/work/drafter_ckpt.pt" ] && [ "${RESUME:-1}" = 1 ] && resume=(--resume)
exec .venv/bin/flashtree train-drafter --target smollm2-135m-instruct --out "$WORK/out" --work "$WORK/work" \
  --data chat --layers 2 --block-size 8 --num-sequences 2000 --response-tokens 192 --anchors 16 --batch-size 8 \
  --steps 3000 --lr 1e-3 --eval-every 100 --threads 2 "${resume[@]}" "$@"
