#!/usr/bin/env bash
# Session 36: soft labels (--distill-topk 8: each drafted slot's loss against the target's own
# next-token distribution, its top 8 renormalised) against a control, each 400 steps from run 7
# on its 10,000 chats, lr 3e-4 cosine, fresh AdamW: the protocol of session 35's levers
# (benchmarks/run7_temps_2026-12-05/levers/). The distill arm builds the feature store with the
# top-k; the control reads the same store (a store with top-k serves a run without it).
set -x
cd "$(dirname "$0")/../.."
common=(--steps 400 --lr 3e-4 --eval-every 200)
WORK=runs/exp-distill scripts/train_smollm2_drafter.sh "${common[@]}" --distill-topk 8 > runs/exp-distill.log 2>&1
mkdir -p runs/exp-ctl2/work
for f in runs/exp-distill/work/features-1-7-14-20-27.*; do ln -sf "$PWD/$f" runs/exp-ctl2/work/; done
WORK=runs/exp-ctl2 scripts/train_smollm2_drafter.sh "${common[@]}" > runs/exp-ctl2.log 2>&1
