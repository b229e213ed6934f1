#!/usr/bin/env bash
# Copies what a session's training run made into training/smollm2-135m-instruct-drafter/ for
# committing: the data (gzipped), the held-out answers, the progress log, the latest drafter
# (bf16 is not used: the drafter resumes in float32) and its report.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/smollm2-drafter}
KEPT=training/smollm2-135m-instruct-drafter
mkdir -p "$KEPT"
for f in regenerated.jsonl heldout_greedy.jsonl; do
  [ -f "$WORK/work/$f" ] && gzip -9 -c "$WORK/work/$f" > "$KEPT/$f.gz"
done
[ -f "$WORK/work/drafter_log.jsonl" ] && cp "$WORK/work/drafter_log.jsonl" "$KEPT/"
if [ -f "$WORK/out/model.safetensors" ]; then
  mkdir -p "$KEPT/drafter" && cp "$WORK/out/config.json" "$WORK/out/model.safetensors" "$KEPT/drafter/"
  [ -f "$WORK/out/training_report.json" ] && cp "$WORK/out/training_report.json" "$KEPT/drafter/"
fi
ls -la "$KEPT"
