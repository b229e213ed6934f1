#!/usr/bin/env bash
# Drafter run 10: run 9u continued against the target as dtype auto now serves it from its GGUF
# (Q4_1 blocks, float32 activations; features rounded to the bf16 the engine hands the drafter),
# on 3,000 package chats no run saw, the first round's 3,939 user-like rows and the second round's
# rows (`scripts/user_chats.py more`: everyday questions from a second template list, then second
# turns after the first round's code and everyday answers), cut where its generation was stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
KEPT=training/smollm2-135m-instruct-drafter
W=runs/r10
# 1. τ of run 9u against this target, and the target's greedy answers to both held-out sets
.venv/bin/python scripts/user_chats.py tau --cache $W/greedy_f32 --json $W/tau_run9u_f32.json
# 2. the second round of user-like rows (stopped after ROUND2 rows)
.venv/bin/python scripts/user_chats.py more $W/more_rows.jsonl --user-rows $KEPT/user_rows.jsonl.gz
# 3. the training rows; the held-out curves on this target's own greedy answers
mkdir -p $W/work
zcat $KEPT/regenerated.jsonl.gz | sed -n '24001,27000p' > $W/work/regenerated.jsonl
zcat $KEPT/user_rows.jsonl.gz >> $W/work/regenerated.jsonl
head -n "${ROUND2:-2560}" $W/more_rows.jsonl >> $W/work/regenerated.jsonl
cp $W/greedy_f32/greedy_heldout_chats.jsonl $W/work/heldout_greedy.jsonl
cp $W/greedy_f32/greedy_heldout_user_chats.jsonl $W/work/heldout_user_greedy.jsonl
N=$(wc -l < $W/work/regenerated.jsonl)
WORK=$W scripts/train_smollm2_drafter.sh --num-sequences "$N" --steps 500 --lr 3e-4 --eval-every 250  # 0.42 epoch, for time
