"""Greedy DFlash acceptance per held-out prompt, and a paired comparison of two such runs (issue 15).

  python benchmarks/refit/tau_per_prompt.py run OUT.json [--drafter DIR]   # all 353 held-out prompts, T=0
  python benchmarks/refit/tau_per_prompt.py compare BEFORE.json AFTER.json # tau of each, paired bootstrap CI

`run` writes [rounds, accepted tokens] per prompt (dflash, 128 tokens, greedy). It uses only the
public API, so it also runs against an older checkout of flashtree (PYTHONPATH=OLD/src) — the way
the drafter refit was compared with the drafter it replaced, each under the code it was built for.
`compare` resamples prompts (4,000 draws) and reports the 95 % interval of tau(after) - tau(before).
"""
import argparse
import json

import numpy as np


def run(out: str, drafter: str | None) -> None:
    import torch

    from flashtree import LLM, SamplingParams
    from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
    from flashtree.train.corpus import load_prompts
    torch.set_num_threads(2)
    llm = LLM(BUNDLED_TARGET, drafter or str(BUNDLED_DRAFTER), max_batch_size=8, method="dflash")
    prompts = load_prompts()
    outs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=128) for _ in prompts], method="dflash")
    per = [[len(o.metrics.accept_lengths), sum(o.metrics.accept_lengths)] for o in outs]
    with open(out, "w") as f:
        json.dump({"drafter": drafter or "bundled", "max_tokens": 128, "rounds_tokens": per}, f)
    print(f"{len(per)} prompts: tau {sum(p[1] for p in per) / sum(p[0] for p in per):.3f}")


def tau(rows: np.ndarray) -> float:
    # pooled over rounds: accepted tokens / rounds (as flashtree bench and measure_bundled count it)
    return rows[:, 1].sum() / rows[:, 0].sum()


def compare(before: str, after: str, draws: int = 4000) -> None:
    a = np.array(json.load(open(before))["rounds_tokens"], dtype=float)
    b = np.array(json.load(open(after))["rounds_tokens"], dtype=float)
    if a.shape != b.shape:
        raise SystemExit(f"the runs cover different prompts ({len(a)} vs {len(b)})")
    rng = np.random.default_rng(0)
    for name, n in (("first 32", 32), (f"all {len(a)}", len(a))):
        x, y = a[:n], b[:n]
        diffs = [tau(y[s]) - tau(x[s]) for s in (rng.integers(0, n, n) for _ in range(draws))]
        lo, hi = np.percentile(diffs, [2.5, 97.5])
        both = (x[:, 0] > 0) & (y[:, 0] > 0)  # a prompt whose first token was EOS has no round
        rx, ry = x[both, 1] / x[both, 0], y[both, 1] / y[both, 0]
        better, worse = int((ry > rx).sum()), int((ry < rx).sum())
        print(f"{name:>9} prompts: tau {tau(x):.3f} -> {tau(y):.3f} ({tau(y) - tau(x):+.3f}, 95% CI "
              f"[{lo:+.3f}, {hi:+.3f}]); per prompt {better} higher, {worse} lower")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--drafter", default=None)
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    a = p.parse_args()
    run(a.out, a.drafter) if a.cmd == "run" else compare(a.before, a.after)
