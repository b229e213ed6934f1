#!/usr/bin/env bash
# Session 38, after commands.sh: run 8 with its draft vocabulary cut to run 7's size (15,626 of
# 19,457 tokens: scripts/build_draft_vocab.py DIR --size 15626) against run 7, one pair of
# processes, to see whether the larger vocabulary is what slowed run 8's hybrid configs.
set -x
cd "$(dirname "$0")/../.."
OUT=benchmarks/run8_2026-12-05
for pair in "run8v run8_v15626" "run7v run7_bundle"; do
  set -- $pair
  .venv/bin/flashtree bench --model smollm2-135m-instruct --draft runs/$2 --prompts chats --num-prompts 8 \
    --max-tokens 128 --methods ar,dflash,ddtree,hybrid --budgets 8,16,auto --temperatures 0 --concurrency 1 \
    --repeats 2 --no-peers --exact-samples 0 --out $OUT/vocab/$1
  uptime | tee -a $OUT/uptime.txt
done
