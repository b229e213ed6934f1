"""A drafter's reduced draft vocabulary (EAGLE-3's and FR-Spec's idea): the target tokens its
drafts may use, chosen by how often the target itself says them.

A DFlash drafter scores every position of its block through the target's LM head; on a small
target that head is most of a drafter pass's bytes (SmolLM2-135M bf16: 49,152 rows, 57 MB). The
drafts only have to be likely, not complete: the target verifies each one, so a token outside the
vocabulary costs acceptance where the target says it, never exactness. The rule: every token that
occurs in the target's own responses to the training chats, most frequent first, plus its end
tokens (a draft of the end of an answer). Written as `draft_vocab.json` beside the drafter's
config (`config.DRAFT_VOCAB_FILE`), which the model runner reads. Nothing here runs a model.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from ..config import DRAFT_VOCAB_FILE


def response_counts(rows: Iterable[dict]) -> Counter:
    """How often each token occurs in the responses of rows {ids, prompt_len} (prompts excluded:
    a draft is of what the target says)."""
    counts = Counter()
    for r in rows:
        counts.update(r["ids"][r["prompt_len"]:])
    return counts


def choose(counts: Counter, always: Iterable[int] = (), size: int | None = None) -> list[int]:
    """Token ids by descending count (ties: lower id first), `always` first; at most `size`."""
    ids = list(dict.fromkeys([*always, *sorted(counts, key=lambda t: (-counts[t], t))]))
    return ids if size is None else ids[:size]


def coverage(ids: Iterable[int], rows: Iterable[dict]) -> float:
    """The share of the response tokens of `rows` that are in `ids`."""
    counts = response_counts(rows)
    kept = set(ids)
    total = sum(counts.values())
    return sum(n for t, n in counts.items() if t in kept) / total if total else 0.0


def write(drafter_dir: str | Path, ids: list[int], about: dict) -> Path:
    path = Path(drafter_dir) / DRAFT_VOCAB_FILE
    path.write_text(json.dumps({**about, "size": len(ids), "token_ids": ids}) + "\n")
    return path
