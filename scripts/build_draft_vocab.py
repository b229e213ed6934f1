"""Writes a drafter's draft vocabulary (`draft_vocab.json`, see flashtree/train/draft_vocab.py)
from the target's regenerated training answers, and reports its coverage of held-out answers.

  python scripts/build_draft_vocab.py DRAFTER_DIR [--size N]
      [--data training/smollm2-135m-instruct-drafter/regenerated.jsonl.gz [MORE ...]]
      [--heldout training/smollm2-135m-instruct-drafter/heldout_greedy.jsonl.gz]
"""
import argparse
import gzip
import json
from pathlib import Path

from flashtree.models.registry import resolve
from flashtree.tokenizer import Tokenizer
from flashtree.train.draft_vocab import choose, coverage, response_counts, write

KEPT = Path(__file__).resolve().parents[1] / "training/smollm2-135m-instruct-drafter"


def rows(path: Path) -> list[dict]:
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("drafter")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--size", type=int, default=None, help="at most this many tokens (default: every one seen)")
    p.add_argument("--data", type=Path, nargs="+", default=[KEPT / "regenerated.jsonl.gz"],
                   help="the training answers, one file or several (read as one)")
    p.add_argument("--heldout", type=Path, default=KEPT / "heldout_greedy.jsonl.gz")
    a = p.parse_args()
    train, held = [r for path in a.data for r in rows(path)], rows(a.heldout)
    ends = Tokenizer(resolve(a.target).target).eos_token_ids
    ids = choose(response_counts(train), ends, a.size)
    about = {"rule": "tokens of the target's responses to the training chats, most frequent first, "
                     "plus its end tokens", "data": " + ".join(path.name for path in a.data), "rows": len(train),
             "heldout_coverage": round(coverage(ids, held), 4)}
    print(write(a.drafter, ids, about), {k: v for k, v in about.items() if k != "rule"}, "size", len(ids))


if __name__ == "__main__":
    main()
