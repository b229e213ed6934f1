#!/usr/bin/env bash
# The A/B of the auto verdict (README §1): the commit before it (a203978) against 3c041ad, processes
# alternating old, new, old, new, one timed pass each, ar + ddtree@auto at T 0/1 and C 1/8. Its outputs
# were not kept (run in /tmp); this reproduces the comparison. Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${OLD:-/tmp/flashtree-before-verdict}
[ -d "$OLD" ] || git worktree add -f "$OLD" a203978
for rep in 1 2; do
  for which in old new; do
    src=$PWD/src; [ $which = old ] && src=$OLD/src
    PYTHONPATH=$src .venv/bin/python -m flashtree.cli bench --model smollm2-135m-instruct --prompts chats \
      --num-prompts 8 --max-tokens 128 --methods ar,ddtree --budgets auto --temperatures 0,1.0 --top-p 0.95 \
      --concurrency 1,8 --repeats 1 --no-peers --exact-samples 0 --out "${OUT:-/tmp/ab_verdict}/${which}_$rep"
  done
done
