#!/usr/bin/env bash
# After the change: this tree (float32 activations beside bf16 storage for a blocks target under
# dtype auto) against the commit before it (a worktree at $BEFORE, bf16 activations), alternating
# processes, ar and the default, C=1, T=0, 16 held-out chats x 128 tokens, per path.
#   git worktree add /tmp/before 5e0de55 && ../shared/tools/quiet && BEFORE=/tmp/before bash benchmarks/f32_activations_2026-12-07/ab2.sh amx avx2
set -euo pipefail
out=benchmarks/f32_activations_2026-12-07
for isa in "$@"; do
  for arm in after before after before; do
    n=$(ls "$out" | grep -c "^ab2_${isa}_${arm}_.*log" || true)
    src=src; [ "$arm" = before ] && src=$BEFORE/src
    PYTHONPATH=$src FLASHTREE_ISA=$isa .venv/bin/python -m flashtree.cli bench --model smollm2-135m-instruct \
      --prompts chats --num-prompts 16 --max-tokens 128 --methods ar,hybrid --budgets auto --temperatures 0 \
      --concurrency 1 --repeats 2 --no-peers --exact-samples 0 --out "$out/ab2_${isa}_${arm}_$n" > "$out/ab2_${isa}_${arm}_$n.log" 2>&1
  done
done
