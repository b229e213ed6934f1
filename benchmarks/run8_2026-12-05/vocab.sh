#!/usr/bin/env bash
# Run 8 with its draft vocabulary cut to run 7's size (15,626 of 19,457 tokens) against run 7, the
# bundled drafter, in benchmarks/run8_2026-12-05/compare_drafters.sh's interleaved bench (OUT/vocab). Session 38 ran
# one pair, the first half of this, into vocab/run8v and vocab/run7v; the next run adds the second.
# The run 8 directory: training/'s float32 drafter (the loader casts it to the target's bf16, as
# scripts/keep_smollm2_drafter.sh does) with scripts/build_draft_vocab.py --size 15626.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run8_2026-12-05/vocab
KEPT=training/smollm2-135m-instruct-drafter
R8=${R8:-runs/run8_v15626}
if [ ! -f "$R8/draft_vocab.json" ]; then
  mkdir -p "$R8" && cp "$KEPT/drafter/config.json" "$KEPT/drafter/model.safetensors" "$R8/"
  .venv/bin/python scripts/build_draft_vocab.py "$R8" --size 15626 --data "$KEPT/regenerated.jsonl.gz"
fi
../shared/tools/quiet 120 || exit 1
benchmarks/run8_2026-12-05/compare_drafters.sh "$OUT" run8v "$R8" run7v ""
