"""Does the engine's dflash lose acceptance that teacher forcing finds? (issue 40)

On held-out greedy answers of the real target, three τ per row:
  positional — the teacher-forced chain τ averaged over every response position (the training curve's),
  walked     — the same per-position τ walked as rounds (a round at p commits τ(p), the next opens at
               p + τ(p)): what an engine that loses nothing reports,
  engine     — `LLM(method="dflash")` on the same prompt, greedy, as many tokens as the answer.
Walked == engine (per row, when the engine's text equals the answer) means inference loses nothing; the
positional > walked gap is the averaging, not a loss.

  python benchmarks/real_pair_2026-12-04/measure_tau_gap.py OUT.json [--rows 16] [--drafter DIR]
"""
import argparse
import gzip
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "training/smollm2-135m-instruct-drafter/heldout_greedy.jsonl.gz"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--drafter", default=None, help="drafter directory (default: the bundled one)")
    a = p.parse_args()
    from flashtree import LLM, SamplingParams
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.models.registry import resolve
    from flashtree.train.drafter import chain_taus, usable, walk

    found = resolve("smollm2-135m-instruct", a.drafter)
    rows = usable([json.loads(line) for line in gzip.open(HELDOUT, "rt")], 8)[:a.rows]
    target = load_target(found.target, dtype="auto", device="cpu")
    drafter = load_drafter(found.drafter, target).eval()
    mask_id, B = drafter.config.mask_token_id, drafter.config.block_size
    per_pos = [chain_taus(drafter, target, r, B, mask_id) for r in rows]
    del target, drafter

    llm = LLM("smollm2-135m-instruct", found.drafter, method="dflash", max_batch_size=1)
    outs = llm.generate([r["ids"][:r["prompt_len"]] for r in rows],
                        [SamplingParams(temperature=0, max_tokens=len(r["ids"]) - r["prompt_len"], ignore_eos=True)
                         for r in rows], use_tqdm=False)
    report = []
    for r, taus, o in zip(rows, per_pos, outs):
        walked = walk(taus)
        rounds, tokens = len(walked), sum(walked)
        m = o.metrics
        answer = r["ids"][r["prompt_len"]:]
        split = next((i for i, (x, y) in enumerate(zip(o.token_ids, answer)) if x != y), len(answer))
        report.append({"positional": taus.mean().item(), "walked": tokens / rounds,
                       "engine": m.mean_accept_length, "same_text": o.token_ids == answer, "first_difference": split,
                       "walked_rounds": rounds, "engine_rounds": m.rounds})
    pooled = {k: sum(x[k] for x in report) / len(report) for k in ("positional", "walked", "engine")}
    pooled["same_text"] = sum(x["same_text"] for x in report)
    Path(a.out).write_text(json.dumps({"rows": report, "mean": pooled}, indent=1) + "\n")
    for x in report:
        print(f"pos {x['positional']:.2f}  walked {x['walked']:.2f} ({x['walked_rounds']} rounds)  "
              f"engine {x['engine']:.2f} ({x['engine_rounds']} rounds)  same text {x['same_text']} (to {x['first_difference']})")
    print("mean", {k: round(v, 3) for k, v in pooled.items()})


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
