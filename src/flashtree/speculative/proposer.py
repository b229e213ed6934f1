"""The drafting-method seam: the `Proposer` interface and the one registry of methods.

A method turns a sequence's committed tokens (and whatever state it keeps, e.g. the drafter's
context) into a `DraftTree` each round; the engine packs every tree into one target forward,
walks it with the one verify rule (`verify.py`) and commits the accepted path, then tells the
method what was committed (`on_commit`). Methods never see the verify draws, so every method is
lossless. Packing, verification and the walk are shared; nothing here runs the target.

Adding a method = one file with a `Proposer` subclass + its line in `REGISTRY`. The server's
schema, the CLI choices, `bench`, `env` and the error messages all read `METHODS`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..errors import RequestError
from .limits import RequestLimits
from .tree import DraftTree

if TYPE_CHECKING:
    from ..engine.sequence import Sequence
    from .adaptive import AdaptiveBudget
    from .dflash import DFlashDrafts

# the one list of drafting methods: name -> "module:Class" in this package
REGISTRY: dict[str, str] = {
    "ar": "ar:AR",
    "ngram": "ngram:NGram",
    "dflash": "dflash:DFlash",
    "ddtree": "ddtree:DDTree",
    "hybrid": "hybrid:Hybrid",
}
METHODS: tuple[str, ...] = tuple(REGISTRY)
PLAIN = "ar"  # the method that drafts nothing: plain decoding, the reference every other method is compared with

# what each per-request option shapes, for the messages that refuse it
OPTION_MEANING = {"budget": "the draft tree's size", "topk": "the most children per tree node",
                  "block_size": "the drafter's block length", "max_ngram": "the longest n-gram looked up",
                  "min_ngram": "the shortest n-gram looked up", "draft_len": "the n-gram chain's length"}


@dataclass(frozen=True, slots=True)
class DraftShape:
    """A request's drafting settings as its method resolved them (`Proposer.configure`), the
    fields the engine gives its `Sequence`."""
    block_size: int = 1         # deepest draft + 1 (1: plain decoding)
    budget: int = 0             # draft nodes a round (0: plain decoding)
    topk: int | None = None     # most children per tree node (None: no cap)
    auto: bool = False          # budget="auto": each round verifies a chosen prefix of its tree
    options: dict = field(default_factory=dict)  # method-specific settings (ngram's n-gram sizes)


@dataclass(frozen=True, slots=True)
class ProposerContext:
    """What the engine gives its proposers: the limits requests are checked against, auto's
    measured costs (`adaptive.costs`, read when used: ngram sizes its copies by them) and the one
    drafter pass (None without a drafter)."""
    limits: RequestLimits
    adaptive: AdaptiveBudget
    drafts: DFlashDrafts | None


class Proposer:
    """One drafting method. One instance per engine, shared by all its sequences of that method;
    per-sequence state lives in dicts keyed by the `Sequence` (freed in `release`)."""
    name: ClassVar[str]
    needs_drafter: ClassVar[bool] = False
    sized_by_costs: ClassVar[bool] = False     # it sizes its drafts by auto's measured costs (seeded for it)
    options: ClassVar[tuple[str, ...]] = ()    # per-request options it takes (others are refused)
    drafts: ClassVar[str] = "drafts nothing"   # how it drafts, for the messages that refuse an option
    summary: ClassVar[str] = ""                # one line for `env` and the docs
    sized_by_budget: ClassVar[bool] = False    # its drafts are trees of a node budget (it takes "budget")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.sized_by_budget = "budget" in cls.options  # one truth: the options a method takes

    def __init__(self, given: ProposerContext):
        self.limits, self.adaptive, self.drafter_pass = given.limits, given.adaptive, given.drafts

    def configure(self, block_size: int | None, budget: int | None, topk: int | None,
                  options: dict) -> DraftShape:
        """Validate a request's options (only those in `options` reach here) and resolve its
        drafting settings."""
        return DraftShape()

    @classmethod
    def round_tokens(cls, budget: int | str | None, topk: int | None, block_size: int, draft_len: int) -> int | None:
        """Tokens per sequence in one verify forward of a round that drafts to the full depth:
        the root and its draft nodes (None: budget "auto", whose size changes every round)."""
        return 1

    def prepare(self, seqs: list[Sequence]) -> None:
        """Called for every method's sequences before any `draft` of the round, so methods sharing
        a model pass (the DFlash family) can run it once for all of them."""

    def draft(self, seqs: list[Sequence], depths: list[int]) -> list:
        """This round's draft of each sequence (depths[i] >= 1: the deepest node worth verifying),
        or None for "no draft" (the tree is the root alone). Must not change sequence state."""
        return [None] * len(seqs)

    def tree(self, seq: Sequence, draft, depth: int) -> DraftTree:
        raise NotImplementedError

    def on_prefill(self, seq: Sequence, rows: int) -> None:
        """A prefill chunk of `rows` prompt rows is in the target cache (with its drafter features,
        in the model runner's `features`, when the method needs the drafter)."""

    def on_commit(self, seq: Sequence, tree: DraftTree, path: list[int]) -> None:
        """The accepted nodes `path` of this round's `tree` (root first) are committed (their
        drafter features on their final rows when the method needs the drafter). Called before
        the round's tokens are appended to `seq`, after every round in which any sequence had a
        draft; a round with none (every tree the root: no drafter pass, nothing copied) leaves
        proposers as they were and is not reported."""

    def release(self, seq: Sequence) -> None:
        """The sequence left the engine: drop its state."""


def proposer_class(method: str) -> type[Proposer]:
    module, cls = REGISTRY[method].split(":")
    return getattr(importlib.import_module(f".{module}", __package__), cls)


def needs_drafter(method: str) -> bool:
    return proposer_class(method).needs_drafter


def drafting_methods(has_drafter: bool = True) -> list[str]:
    """Every method but PLAIN, in registry order; without a drafter, those that need none."""
    return [m for m in METHODS if m != PLAIN and (has_drafter or not needs_drafter(m))]


def takers(option: str) -> list[str]:
    """The methods that take a per-request option."""
    return [m for m in METHODS if option in proposer_class(m).options]


def default_method(has_drafter: bool) -> str:
    """method=None: hybrid when the model has a drafter, else ngram — both sized by budget "auto",
    which decodes plainly where drafting does not pay (hybrid was the best config in every run on
    the real pair; ngram needs no drafter)."""
    return "hybrid" if has_drafter else "ngram"


def check_method(method: str, has_drafter: bool) -> type[Proposer]:
    """The method's proposer class; a name not registered, or a drafter method without a
    drafter, is refused saying what is possible."""
    if method not in METHODS:
        raise RequestError(f"method '{method}' is not supported; choose one of {', '.join(METHODS)}", "speculative")
    cls = proposer_class(method)
    if cls.needs_drafter and not has_drafter:
        free = ", ".join(f"'{m}'" for m in METHODS if not proposer_class(m).needs_drafter)
        raise RequestError(f"method '{method}' needs a DFlash drafter; load one with draft=DIR or use "
                           f"one of {free}", "speculative")
    return cls


def refuse_options(method: str, **given) -> None:
    """An option the method does not take would be ignored, so it is refused instead."""
    cls = proposer_class(method)
    for name, value in given.items():
        if value is None or name in cls.options:
            continue
        ok = takers(name)
        which = f"method '{ok[0]}'" if len(ok) == 1 else "methods " + ", ".join(f"'{m}'" for m in ok)
        raise RequestError(f"{name} applies to {which} only ({OPTION_MEANING[name]}); method '{method}' "
                           f"{cls.drafts}, so {name}={value!r} would be ignored: drop it or use method='{ok[0]}'",
                           "speculative")
