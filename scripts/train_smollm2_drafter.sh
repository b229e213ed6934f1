#!/usr/bin/env bash
# Reproduces the SmolLM2-135M-Instruct drafter (bundled/smollm2-135m-instruct-drafter): data from
# the target's own answers to stdlib chat requests, then DFlash training; resumable — run it again
# to continue where the last run stopped (RESUME=0 starts over in a fresh WORK).
#
# What lasts across machines is committed in training/smollm2-135m-instruct-drafter/: the
# regenerated data (gzipped JSONL), the held-out answers, the progress log and the latest
# drafter. A fresh WORK starts from them: the data is not generated again, and a committed
# drafter is the starting point (--init-from; the optimiser state is not kept).
#
# The bundled drafter is run 8 of a chain, each run from the one before (docs/real-pair.md):
# run 2 on 2,000 chats (--num-sequences 2000), run 3 on 5,000 (--steps 2000), runs 4 and 5 on
# 6,728 and 10,000 (--steps 1500 --lr 3e-4), all reading target layers 1,27 (--target-layer-ids
# 1,27); run 7 moved run 5 to five target layers (--steps 1500 --lr 5e-4, the default layers
# below); run 8 continued run 7 on 18,000 chats (--num-sequences 18000 --steps 2250 --lr 3e-4),
# bundled by scripts/keep_smollm2_drafter.sh with a 15,626-token draft vocabulary.
# Later arguments override the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/smollm2-drafter}
KEPT=training/smollm2-135m-instruct-drafter
mkdir -p "$WORK/work"
for f in regenerated.jsonl heldout_greedy.jsonl; do
  if [ ! -f "$WORK/work/$f" ] && [ -f "$KEPT/$f.gz" ]; then gunzip -c "$KEPT/$f.gz" > "$WORK/work/$f"; fi
done
extra=()
if [ -f "$WORK/work/drafter_ckpt.pt" ] && [ "${RESUME:-1}" = 1 ]; then
  extra=(--resume)
elif [ -f "$KEPT/drafter/model.safetensors" ] && [ "${RESUME:-1}" = 1 ]; then
  extra=(--init-from "$KEPT/drafter")
fi
exec .venv/bin/flashtree train-drafter --target smollm2-135m-instruct --out "$WORK/out" --work "$WORK/work" \
  --data chat --layers 2 --target-layer-ids 1,7,14,20,27 --block-size 8 --num-sequences 10000 \
  --response-tokens 192 --anchors 16 --batch-size 8 --steps 3000 --lr 1e-3 --eval-every 100 --threads 2 "${extra[@]}" "$@"
