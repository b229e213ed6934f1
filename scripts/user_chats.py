"""Chats like users send (`train/user_chats.py`): the held-out set, training data, and a drafter's τ on them.

    python scripts/user_chats.py heldout                  # writes src/flashtree/data/heldout_user_chats.jsonl
    python scripts/user_chats.py extend OUT.jsonl --from training/.../regenerated.jsonl.gz [--second-turns 1500]
    python scripts/user_chats.py more OUT.jsonl --user-rows training/.../user_rows.jsonl.gz
    python scripts/user_chats.py tau [--drafter DIR] [--chats FILE ...] [--json OUT]

`heldout` runs the target greedily for the second turns' first answers (up to 256 tokens) and writes
48 chats: 8 other-language code, 8 held-out packages' Python, 16 everyday questions, 16 second turns,
interleaved so that the first 16 (the bench's `--prompts user --num-prompts 16`) hold each part.
`extend` appends to OUT (the trainer's regenerated.jsonl format; resumable) the target's answers to
the training half: every other-language code request and everyday question, then `--second-turns`
follow-ups after answers in `--from` (its stdlib rows, whose requests `chats.chat_prompts` rebuilds);
greedy, or sampled at T 0.6 / 1.0 (top-p 0.95) as the recipe samples. `more` appends the second round: the everyday questions of the second template list, then a second
turn after every single-turn row of `--user-rows` (the first round's code and everyday answers, whose
requests `user_chats.user_requests` rebuilds). `tau` prints the drafter's
held-out chain τ (every position, teacher-forced) and walked τ (the rounds an engine runs) on the
target's greedy answers (192 tokens, cached beside --json) to each chat file: by default the project's
held-out chats (the first 48) and the user-like set.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

import torch

from flashtree.models.loader import load_drafter, load_target
from flashtree.models.registry import resolve
from flashtree.tokenizer import Tokenizer
from flashtree.train import drafter as recipe
from flashtree.train import user_chats
from flashtree.train.chats import HELDOUT_CHATS, HELDOUT_USER_CHATS, chat_prompts, load_heldout

USER_CHATS = HELDOUT_USER_CHATS
MODEL = "smollm2-135m-instruct"


def _target():
    m = resolve(MODEL)
    target = load_target(m.target, dtype="auto", device="cpu")
    target.fuse()
    return m, target, Tokenizer(m.target)


def heldout(args) -> None:
    single, firsts = user_chats.heldout_user_requests()
    _, target, tok = _target()
    with torch.inference_mode():
        answers = recipe.greedy_answers(target, tok, [r["messages"] for r in firsts], 256)
    follow = user_chats.HELDOUT_FOLLOW_UPS
    seconds = [{"id": f"{r['id']}:second", "kind": f"second-{r['kind']}",
                "messages": user_chats.second_turn(r["messages"], tok.decode(a["ids"][a["prompt_len"]:]).strip(),
                                                   follow[i % len(follow)])}
               for i, (r, a) in enumerate(zip(firsts, answers))]
    parts = [single[:8], single[8:16], single[16:], seconds]  # other code, held-out packages, everyday, second turns
    rows = [part[i] for i in range(max(map(len, parts))) for part in parts if i < len(part)]  # any prefix mixes them
    USER_CHATS.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} chats to {USER_CHATS}")


def _read_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def extend(args) -> None:
    m, target, tok = _target()
    convs = [r["messages"] for r in user_chats.user_requests(seed=0)]
    if args.second_turns:
        old = _read_rows(Path(args.source))
        stdlib = chat_prompts("train", seed=0)  # the stdlib's requests: the data's first rows, in order
        rng = random.Random(1)
        picks = rng.sample(range(min(len(stdlib), len(old))), args.second_turns)
        follow = user_chats.FOLLOW_UPS
        for i in picks:
            row = old[i]
            if tok.encode_chat(stdlib[i]["messages"])[-row["prompt_len"]:] != row["ids"][:row["prompt_len"]]:
                sys.exit(f"{args.source} row {i} is not the answer to stdlib request {i}: pass the committed data")
            answer = tok.decode(row["ids"][row["prompt_len"]:]).strip()
            convs.append(user_chats.second_turn(stdlib[i]["messages"], answer, follow[rng.randrange(len(follow))]))
    plan = recipe.sampling_plan(convs, 0.3, random.Random(2))
    with torch.inference_mode():
        recipe.write_answers(target, tok, plan, Path(args.out), 192, 1024)
    print(f"{args.out}: {len(plan)} rows")


def more(args) -> None:
    m, target, tok = _target()
    convs = [r["messages"] for r in user_chats.more_general_requests()]
    first = _read_rows(Path(args.user_rows))
    single = user_chats.user_requests(seed=0)  # the first round's single-turn requests: its rows, in order
    rng = random.Random(3)
    for i, (request, row) in enumerate(zip(single, first)):
        if tok.encode_chat(request["messages"])[-row["prompt_len"]:] != row["ids"][:row["prompt_len"]]:
            sys.exit(f"{args.user_rows} row {i} is not the answer to user request {i}: pass the committed rows")
        answer = tok.decode(row["ids"][row["prompt_len"]:]).strip()
        follow = user_chats.FOLLOW_UPS[rng.randrange(len(user_chats.FOLLOW_UPS))]
        convs.append(user_chats.second_turn(request["messages"], answer, follow))
    plan = recipe.sampling_plan(convs, 0.3, random.Random(4))
    with torch.inference_mode():
        recipe.write_answers(target, tok, plan, Path(args.out), 192, 1024)
    print(f"{args.out}: {len(plan)} rows")


def tau(args) -> None:
    m, target, tok = _target()
    drafter = load_drafter(Path(args.drafter) if args.drafter else m.drafter, target, quant=None)  # as trained
    drafter.float()
    out = {}
    for path in args.chats or [str(HELDOUT_CHATS), str(USER_CHATS)]:
        chats = load_heldout(path)[:48]
        cache = Path(args.cache) / f"greedy_{Path(path).stem}.jsonl"
        if cache.is_file():
            rows = [json.loads(line) for line in cache.open()]
        else:
            with torch.inference_mode():
                rows = recipe.greedy_answers(target, tok, [c["messages"] for c in chats], 192)
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text("".join(json.dumps(r) + "\n" for r in rows))
        rows = recipe.usable(rows, drafter.config.block_size)
        kinds: dict[str, list[dict]] = {}
        for c, r in zip(chats, rows):
            kinds.setdefault(c.get("kind", "?").split("-")[0], []).append(r)
        with torch.inference_mode():
            res = {"all": recipe.heldout_tau(drafter, target, rows, drafter.config.block_size, drafter.config.mask_token_id)}
            for k, rs in sorted(kinds.items()):
                res[k] = recipe.heldout_tau(drafter, target, rs, drafter.config.block_size, drafter.config.mask_token_id)
        out[Path(path).stem] = res
        for k, v in res.items():
            print(f"{Path(path).stem:24s} {k:10s} tau {v['heldout_tau']:.3f}  walked {v['heldout_walked_tau']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("heldout")
    e = sub.add_parser("extend")
    e.add_argument("out")
    e.add_argument("--from", dest="source", required=True, help="the committed regenerated data (.jsonl or .gz)")
    e.add_argument("--second-turns", type=int, default=1500)
    mo = sub.add_parser("more")
    mo.add_argument("out")
    mo.add_argument("--user-rows", required=True, help="the committed first round (user_rows.jsonl.gz)")
    t = sub.add_parser("tau")
    t.add_argument("--drafter", default=None, help="a drafter directory (default: the bundled one)")
    t.add_argument("--chats", nargs="*", default=None)
    t.add_argument("--cache", default="runs/user_chats", help="where the greedy answers are kept")
    t.add_argument("--json", default=None)
    args = ap.parse_args()
    {"heldout": heldout, "extend": extend, "more": more, "tau": tau}[args.cmd](args)


if __name__ == "__main__":
    main()
