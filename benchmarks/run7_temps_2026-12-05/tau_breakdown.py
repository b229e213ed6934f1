"""Where a drafter's chain rounds end, on the held-out greedy answers of the real target (issue 40).

Per response position the teacher-forced chain τ (`chain_taus`), then walked as an engine's rounds
(`walk`): the share of rounds and of positions at each τ, and each slot's acceptance given the
chain reached it. Rounds open where the previous round's bonus token is, after the drafter's own
miss, so they meet a first-slot miss more often than positions do.

  python benchmarks/run7_temps_2026-12-05/tau_breakdown.py [--drafter DIR] [--rows 48]
"""
import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "training/smollm2-135m-instruct-drafter/heldout_greedy.jsonl.gz"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--drafter", default=None, help="drafter directory (default: the bundled one)")
    p.add_argument("--rows", type=int, default=48)
    a = p.parse_args()
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.models.registry import resolve
    from flashtree.train.drafter import chain_taus, usable, walk

    found = resolve("smollm2-135m-instruct", a.drafter)
    target = load_target(found.target, dtype="auto", device="cpu")
    drafter = load_drafter(found.drafter, target).eval().float()
    B, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    rows = usable([json.loads(line) for line in gzip.open(HELDOUT, "rt")], B)[:a.rows]
    taus = [chain_taus(drafter, target, r, B, mask_id) for r in rows]
    positions = torch.cat(taus)
    rounds = [t for x in taus for t in walk(x)]
    by_round, by_position = Counter(rounds), Counter(positions.int().tolist())
    print(f"{len(rows)} rows: positional τ {positions.mean():.3f}, walked τ {sum(rounds) / len(rounds):.3f}")
    print("τ   rounds  positions")
    for t in range(1, B + 1):
        print(f"{t}   {by_round[t] / len(rounds):6.3f}  {by_position[t] / len(positions):9.3f}")
    for k in range(1, B):
        reached = (positions >= k).sum().item()
        print(f"slot {k}: accepted {(positions >= k + 1).sum().item() / reached:.3f} of the chains that reach it")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
