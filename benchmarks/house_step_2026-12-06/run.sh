#!/bin/sh
# Interleaved before/after processes of tiny_eager.py: BEFORE and AFTER are checkouts' src folders.
# usage: sh run.sh BEFORE_SRC AFTER_SRC > results.txt   (after ../shared/tools/quiet; nothing else running)
here=$(dirname "$0")
for order in "before after" "after before" "before after" "after before" "before after" "after before"; do
  for arm in $order; do
    src=$1; [ "$arm" = after ] && src=$2
    printf '%s ' "$arm"; PYTHONPATH="$src" python "$here/tiny_eager.py" 2>/dev/null | tail -1
  done
done
