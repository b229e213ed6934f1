"""`flashtree verify`: the statistical losslessness report (exit code 1 on any failed cell).

Part 1 enumerates a tiny-vocabulary pair's exact distribution and tests every drafting method's
samples (the registry's: ngram, dflash, ddtree, hybrid) against it across temperatures and
filters, plus negative controls (wrong verifiers that must be flagged). Methods that copy from the
context (ngram, hybrid) run on a prompt that repeats itself, so their copies are verified.
Part 2 (`--pair`) compares dflash and ddtree with plain sampling on a real model pair (default:
the bundled one) with a two-sample chi-square on short continuations. Every run
generates past the tokens it counts, and a speculative cell or row fails unless its mean
accept length is above 1 (otherwise no draft was verified and the check proved nothing).
"""
from __future__ import annotations

import itertools
import json
import sys

from ..errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--samples", type=int, default=20000, help="runs per cell (default 20000)")
    p.add_argument("--temperatures", default="0.7,1.0,1.5")
    p.add_argument("--filters", default="none,top_k,top_p,min_p,all",
                   help="comma list of: none, top_k, top_p, min_p, all")
    p.add_argument("--budget", type=int, default=6, help="tree budget (ddtree, hybrid) on the tiny pair")
    p.add_argument("--methods", default=None, help="comma list of drafting methods (default: all but ar)")
    p.add_argument("--drafts", default=None,
                   help="comma list of: model (the tiny pair's random drafter), target (the target's own "
                        "greedy continuation as drafts: lossless, and accepted often enough to walk deep). "
                        "Default: both for ddtree, target for dflash (the random drafter's argmax chain is "
                        "almost never accepted, so such a cell verifies nothing and fails the tau guard)")
    p.add_argument("--no-controls", action="store_true", help="skip the negative controls")
    p.add_argument("--pair", action="store_true", help="also check a real pair against plain sampling")
    p.add_argument("--model", default=None, help="target for --pair (default: bundled)")
    p.add_argument("--draft", default=None, help="drafter for --pair (default: bundled)")
    p.add_argument("--pair-samples", type=int, default=3000)
    p.add_argument("--json", default=None, help="also write the report to this JSON file")


COPY_PROMPT = [1, 2, 3, 3, 1, 7, 6, 1, 2, 3]


def _row(cell) -> dict:
    return {"cell": cell.label(), "n": cell.n, "p_value": cell.p_value, "tv": cell.tv, "tv_limit": cell.tv_limit,
            "categories": cell.categories, "passed": cell.passed, "n_tokens": cell.n_tokens,
            "mean_accept_length": cell.mean_accept_length, "drafts_verified": cell.drafts_verified,
            "prefix_hit_tokens": cell.prefix_hit_tokens}


def run(args) -> int:
    from tqdm import tqdm

    from ..measure.exactness import (
        FILTERS,
        NEGATIVE_CONTROLS,
        Cell,
        check_cell,
        grid,
        tiny_pair,
    )
    from ..sampling_params import SamplingParams
    temps = tuple(float(t) for t in args.temperatures.split(","))
    filters = tuple(f.strip() for f in args.filters.split(","))
    unknown = [f for f in filters if f not in FILTERS]
    if unknown:
        raise UserError(f"unknown filter(s) {unknown}; choose from {', '.join(FILTERS)}")
    drafts = tuple(d.strip() for d in (args.drafts or "model,target").split(","))
    if not drafts or any(d not in ("model", "target") for d in drafts):
        raise UserError(f"--drafts must be a comma list of model, target; got {args.drafts!r}")
    if args.samples < 100:
        raise UserError("--samples must be >= 100")
    from ..speculative.proposer import drafting_methods, needs_drafter, proposer_class
    drafting = drafting_methods()
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else drafting
    bad = [m for m in methods if m not in drafting]
    if bad or not methods:
        raise UserError(f"--methods: unknown or non-drafting {bad}; choose from {', '.join(drafting)}")
    pair = tiny_pair()

    def budget(m):
        return args.budget if "budget" in proposer_class(m).options else None

    def chain_of_drafter(m):  # a random drafter's argmax chain is almost never accepted: use target drafts
        return needs_drafter(m) and "budget" not in proposer_class(m).options

    def prompt_of(m):  # "1 2 3" recurs, followed by a continuation near the target's greedy path
        return COPY_PROMPT if "max_ngram" in proposer_class(m).options else [1, 2, 3]

    def kinds(m):
        if not needs_drafter(m):
            return ("model",)
        return drafts if args.drafts or not chain_of_drafter(m) else ("target",)
    cells = [c for m in methods for c in grid(temps, filters, ((m, budget(m)),), n=args.samples, drafts=kinds(m))]
    report = {"tiny_pair": [], "negative_controls": [], "pair": []}
    ok = True
    print(f"tiny pair: V=8, block size {pair[1].config.block_size}, first {pair[1].config.block_size + 1} tokens "
          f"(every draw of the first round), {args.samples} samples per cell; pass = chi-square p > 1e-3 "
          "and TV <= max TV of 200 direct samples + 0.005 and mean tau > 1")
    for cell in tqdm(cells, desc="verify", file=sys.stderr, dynamic_ncols=True):
        check_cell(*pair, prompt_of(cell.method), cell)
        report["tiny_pair"].append(_row(cell))
        ok &= cell.passed
        tqdm.write(f"  {'PASS' if cell.passed else 'FAIL'}  {cell.label():55s} p={cell.p_value:.4f} "
                   f"TV={cell.tv:.4f} (limit {cell.tv_limit:.4f}) tau={cell.mean_accept_length:.2f}")
    if not args.no_controls:
        print("negative controls (must FAIL the check):")
        # dflash with target drafts: the random drafter's chains are almost never accepted
        for (name, patch), method in itertools.product(NEGATIVE_CONTROLS.items(), methods):
            kind = "target" if chain_of_drafter(method) else "model"
            cell = check_cell(*pair, prompt_of(method), Cell(method, budget(method),
                                                             SamplingParams(temperature=1.0, top_k=5),
                                                             args.samples, kind), patch=patch)
            caught = cell.rejected()
            ok &= caught
            report["negative_controls"].append({"control": name, "caught": caught, **_row(cell)})
            print(f"  {'CAUGHT' if caught else 'MISSED'}  {name:26s} {method:7s} drafts={kind:6s} p={cell.p_value:.2e} "
                  f"TV={cell.tv:.4f} (limit {cell.tv_limit:.4f}) tau={cell.mean_accept_length:.2f}")
    if args.pair:
        from ..llm import LLM
        from ..measure.exactness import compare_with_plain
        llm = LLM(model=args.model, draft=args.draft, max_batch_size=64)
        for row in compare_with_plain(llm, n=args.pair_samples, methods=[m for m in methods if needs_drafter(m)]):
            report["pair"].append(row)
            ok &= row["passed"]
            print(f"  {'PASS' if row['passed'] else 'FAIL'}  pair {row['method']:7s} T={row['temperature']} "
                  f"p={row['p_value']:.4f} categories={row['categories']} tau={row['mean_accept_length']:.2f} "
                  f"(first {row['n_tokens']} of {row['max_tokens']} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1
