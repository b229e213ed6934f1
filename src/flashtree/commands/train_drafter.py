"""`flashtree train-drafter --target DIR --out DIR`: the DFlash recipe for any supported target."""
from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from ..train.drafter import DrafterRecipe
    d = DrafterRecipe()
    p.add_argument("--target", required=True, help="target: a model name (flashtree models), an HF directory "
                   "or a .gguf file")
    p.add_argument("--out", required=True, help="output drafter directory (z-lab DFlash format)")
    p.add_argument("--work", default=None, help="data/checkpoint directory (default: OUT/../<name>-work)")
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--layers", type=int, default=d.num_layers, help="drafter decoder layers")
    p.add_argument("--target-layer-ids", default=None,
                   help="comma list (default: z-lab's build_target_layer_ids; never the last layer)")
    p.add_argument("--mask-token-id", type=int, default=None, help="default: the tokenizer's <|mask|> token")
    p.add_argument("--num-sequences", type=int, default=d.num_sequences, help="target-regenerated sequences")
    p.add_argument("--response-tokens", type=int, default=d.response_tokens)
    p.add_argument("--anchors", type=int, default=d.anchors, help="blocks per sequence")
    p.add_argument("--walk-anchors", type=float, default=d.walk_anchors,
                   help="share of each sequence's blocks opened where a greedy round from a uniform one would open "
                        "next (after the drafter's own miss: where an engine's rounds land), 0 to 1")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--gamma", type=float, default=d.gamma,
                   help="loss decay over block slots, weight exp(-(k-1)/gamma) (default: 7 / 5 / 4 for block 16 / 10 / 8)")
    p.add_argument("--distill-topk", type=int, default=d.distill_topk,
                   help="train against the target's own next-token distribution (its top K, renormalised) instead "
                        "of the sampled token; 0 = the token (the features pass keeps the top K)")
    p.add_argument("--no-warm-start", action="store_true", help="random init instead of the target's last layers")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work")
    p.add_argument("--init-from", default=None,
                   help="start from this trained drafter (same shape; fc refit to --target-layer-ids)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this long")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--target-dtype", default=d.target_dtype, help="the target's dtype for data and features "
                   "(auto: the one it serves in on this machine)")
    p.add_argument("--data", choices=("corpus", "chat"), default=d.data,
                   help="corpus: continuations of stdlib slices (a code model); chat: the target's answers to chat "
                        "requests built from stdlib text (a chat model), with a held-out tau curve")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between checkpoints and held-out τ")
    p.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    import torch

    from ..errors import UserError
    from ..train.drafter import DrafterRecipe, train_drafter
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("block_size", "layers", "num_sequences", "anchors", "batch_size", "steps", "response_tokens"):
        if getattr(args, name) < (2 if name == "block_size" else 1):
            raise UserError(f"--{name.replace('_', '-')} must be >= {2 if name == 'block_size' else 1}")
    if not 0 <= args.walk_anchors <= 1:
        raise UserError(f"--walk-anchors must be between 0 and 1, got {args.walk_anchors}")
    if args.distill_topk < 0:
        raise UserError(f"--distill-topk must be >= 0 (0: the token is the label), got {args.distill_topk}")
    if args.gamma is not None and not args.gamma > 0:
        raise UserError(f"--gamma must be > 0 (a slot's loss weight is exp(-(k-1)/gamma)), got {args.gamma}")
    ids = [int(x) for x in args.target_layer_ids.split(",")] if args.target_layer_ids else None
    recipe = DrafterRecipe(block_size=args.block_size, num_layers=args.layers, target_layer_ids=ids,
                           mask_token_id=args.mask_token_id, num_sequences=args.num_sequences,
                           response_tokens=args.response_tokens, anchors=args.anchors,
                           walk_anchors=args.walk_anchors, distill_topk=args.distill_topk,
                           batch_size=args.batch_size, steps=args.steps, lr=args.lr, gamma=args.gamma,
                           warm_start=not args.no_warm_start, seed=args.seed, target_dtype=args.target_dtype,
                           eval_every=args.eval_every, data=args.data)
    out = Path(args.out)
    work = Path(args.work) if args.work else out.parent / f"{out.name}-work"
    from ..models.registry import resolve
    target_dir = resolve(args.target).target
    init_from = Path(args.init_from) if args.init_from else None
    if init_from is not None and not init_from.is_dir():
        raise UserError(f"{args.init_from}: drafter directory not found")
    report = train_drafter(target_dir, out, work, recipe, resume=args.resume, max_minutes=args.max_minutes,
                           init_from=init_from)
    print(f"saved drafter to {out} ({report['steps']} steps, {report['train_hours']:.2f} h)")
    return 0
