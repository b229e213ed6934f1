#!/usr/bin/env bash
# Copies what a session's training run made into training/smollm2-135m-instruct-drafter/ for
# committing: the data (gzipped), the held-out answers, the progress log, the latest drafter
# (float32: the drafter resumes from it) and its report, then the bundled bf16 copy with its
# draft vocabulary (scripts/build_draft_vocab.py, from the kept data): the DRAFT_VOCAB most frequent
# tokens (default 15,626). Every token seen (19,457 for run 8's 18,000 chats) made the drafter's head
# slower for no gain in tau: benchmarks/run8_2026-12-05/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/smollm2-drafter}
KEPT=training/smollm2-135m-instruct-drafter
mkdir -p "$KEPT"
for f in regenerated.jsonl heldout_greedy.jsonl; do
  # (KEEP_DATA=0: a run on a selection of the kept rows, whose data is already kept)
  [ -f "$WORK/work/$f" ] && [ "${KEEP_DATA:-1}" = 1 ] && gzip -9 -n -c "$WORK/work/$f" > "$KEPT/$f.gz"
done
[ -f "$WORK/work/drafter_log.jsonl" ] && cp "$WORK/work/drafter_log.jsonl" "$KEPT/${LOG_NAME:-drafter_log.jsonl}"
if [ -f "$WORK/out/model.safetensors" ]; then
  mkdir -p "$KEPT/drafter" && cp "$WORK/out/config.json" "$WORK/out/model.safetensors" "$KEPT/drafter/"
  [ -f "$WORK/out/training_report.json" ] && cp "$WORK/out/training_report.json" "$KEPT/drafter/"
fi
ls -la "$KEPT"
# the drafter flashtree ships (the registry's smollm2-135m-instruct drafter): the same weights in bf16
BUNDLE=src/flashtree/bundled/smollm2-135m-instruct-drafter
if [ -f "$KEPT/drafter/model.safetensors" ]; then
  .venv/bin/python - "$KEPT/drafter" "$BUNDLE" <<'PY'
import json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

src, dst = map(Path, sys.argv[1:])
dst.mkdir(parents=True, exist_ok=True)
state = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(src / "model.safetensors").items()}
save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
cfg = json.loads((src / "config.json").read_text())
(dst / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}, indent=2) + "\n")
PY
  data=("$KEPT/regenerated.jsonl.gz")
  [ -f "$KEPT/user_rows.jsonl.gz" ] && data+=("$KEPT/user_rows.jsonl.gz")  # the user-like rows (run 9u on)
  .venv/bin/python scripts/build_draft_vocab.py "$BUNDLE" --size "${DRAFT_VOCAB:-15626}" --data "${data[@]}"
  ls -la "$BUNDLE"
fi
