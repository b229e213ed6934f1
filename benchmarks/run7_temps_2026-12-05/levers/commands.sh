#!/usr/bin/env bash
cd /work/main
common=(--steps 400 --lr 3e-4 --eval-every 200)
WORK=runs/exp-ctl scripts/train_smollm2_drafter.sh "${common[@]}" > runs/exp-ctl.log 2>&1
WORK=runs/exp-walk scripts/train_smollm2_drafter.sh "${common[@]}" --walk-anchors 0.5 > runs/exp-walk.log 2>&1
WORK=runs/exp-g2 scripts/train_smollm2_drafter.sh "${common[@]}" --gamma 2 > runs/exp-g2.log 2>&1
