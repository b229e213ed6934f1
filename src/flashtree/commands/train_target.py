"""`flashtree train-target --out DIR`: the bundled target's recipe on the stdlib corpus."""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--out", default="src/flashtree/bundled/target", help="output HF directory")
    p.add_argument("--work", default="runs/target", help="tokenizer/data/checkpoint directory")
    p.add_argument("--steps", type=int, default=1100, help="optimizer steps of 16x256 tokens (the bundled target: 1100)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work")
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and export) after this long")
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 is robust on a shared machine)")


def run(args) -> int:
    import torch

    from ..train.target import TargetRecipe, train_target
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps < 1:
        raise UserError("--steps must be >= 1")
    report = train_target(Path(args.out), Path(args.work), TargetRecipe(steps=args.steps), args.resume, args.max_minutes)
    print(f"saved target to {args.out}: {report['steps']} steps, held-out perplexity {report['heldout_ppl']:.2f}")
    return 0
