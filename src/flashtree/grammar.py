"""Structured output: a request's `StructuredOutput` compiled by xgrammar against the tokenizer, and
each sequence's grammar state — which tokens may come next after its output, and, for a draft
tree, after each node's own path.

xgrammar is the library: on this CPU with the bundled target's 49,152-token vocabulary it fills a
token mask in 3.8 µs on average against llguidance's 57 µs (benchmarks/structured_2026-12-06), and
a draft tree's masks come from one call (`traverse_draft_tree`). It is told the tokenizer by the
`tokenizers` object (a GGUF's tokenizer is written at conversion, `models/gguf.py`) or, for a toy
vocabulary, by the tokens' strings; the grammar's stop tokens are the engine's eos ids, so a
complete output allows only them. A mask is a row of int32 words, bit t of word t // 32 set
when token t is allowed. Nothing here samples, builds trees or runs a model.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from .errors import RequestError
from .sampling_params import StructuredOutput

WHITESPACE = 12  # most blank characters in a row between JSON tokens (a newline and an indent)


def _xgr():
    import xgrammar  # ~2 s to import (it brings transformers): only once a request is constrained
    return xgrammar


def words(vocab_size: int) -> int:
    """int32 words in one token mask."""
    return -(-vocab_size // 32)


class Grammars:
    """Compiles requests' constraints for one vocabulary (xgrammar caches them: the same schema
    compiles once)
    and starts their grammar states. The vocabulary is read on the first constrained request."""

    def __init__(self, tokenizer_info: Callable[[], object], vocab_size: int):
        self._info, self.vocab_size = tokenizer_info, vocab_size
        self._compiler, self._error = None, None
        self._lock = threading.Lock()  # the server compiles on its event loop, the engine thread starts states

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int, stop_ids: list[int]) -> Grammars:
        """For a `tokenizers.Tokenizer` and a model of `vocab_size` logits (>= the tokenizer's)."""
        def info():
            if not stop_ids:
                raise RequestError("structured output needs the model's end-of-sequence token (a grammar ends on "
                                   "it), and its tokenizer names none", "structured")
            from transformers import PreTrainedTokenizerFast
            return _xgr().TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                         vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        return cls(info, vocab_size)

    @classmethod
    def from_vocab(cls, tokens: list[str], stop_ids: list[int]) -> Grammars:
        """For a toy model whose token i is the text tokens[i] (the exactness checks' tiny pairs)."""
        return cls(lambda: _xgr().TokenizerInfo(tokens, _xgr().VocabType.RAW, vocab_size=len(tokens),
                                                 stop_token_ids=list(stop_ids)), len(tokens))

    def prepare(self) -> None:
        """Import xgrammar and read the vocabulary now (~2.5 s with the bundled target), so the first
        constrained request does not wait for them (the server calls it on a thread at start)."""
        with self._lock:
            if self._compiler is None and self._error is None:
                try:
                    self._compiler = _xgr().GrammarCompiler(self._info())
                except Exception as e:  # kept: each constrained request is refused with it
                    self._error = str(e) if isinstance(e, RequestError) else \
                        f"structured output is not available for this tokenizer ({type(e).__name__}: {e})"

    def compile(self, so: StructuredOutput):
        """The compiled grammar of `so`; a spec xgrammar rejects, or a vocabulary it cannot read, is a
        RequestError saying why."""
        self.prepare()
        if self._error is not None:
            raise RequestError(self._error, so.kind)
        return _compiled(self._compiler, so)

    def start(self, so: StructuredOutput, drafts: bool = True) -> GrammarState:
        """A fresh state of `so` (nothing generated yet); drafts: see GrammarState.drafts."""
        return GrammarState(_xgr().GrammarMatcher(self.compile(so)), self.vocab_size, drafts)


def _compiled(compiler, so: StructuredOutput):
    try:
        # JSON laid out as the model likes (its drafts follow it), but at most WHITESPACE blank
        # characters in a row: with no cap a small model loops on newlines; OpenAI's json_object
        # means a JSON object
        if so.json_object:
            return compiler.compile_json_schema('{"type": "object"}', max_whitespace_cnt=WHITESPACE)
        if so.json_schema is not None:
            return compiler.compile_json_schema(so.json_schema, max_whitespace_cnt=WHITESPACE, strict_mode=True)
        if so.regex is not None:
            return compiler.compile_regex(so.regex)
        return compiler.compile_grammar(so.grammar)
    except (RuntimeError, ValueError, TypeError) as e:
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise RequestError(f"the {so.kind.replace('_', ' ')} cannot be compiled: {why}", so.kind) from None


class GrammarState:
    """One sequence's place in its grammar: advanced by each committed token."""

    def __init__(self, matcher, vocab_size: int, drafts: bool = True):
        self.matcher, self.vocab_size = matcher, vocab_size
        self.drafts = drafts  # the engine prunes, over-drafts and forces this sequence's drafts (False: masks only)
        self._last = None  # (tree key, its masks): the last tree_masks answer while the state stands

    def accept(self, token: int) -> None:
        """Advance past a committed token; one the grammar forbids is an error (a mask was skipped)."""
        self._last = None
        if not self.matcher.accept_token(int(token)):
            raise RuntimeError(f"token {token} breaks the request's grammar")

    @property
    def terminated(self) -> bool:
        """The grammar is complete and has taken its stop token: nothing may follow."""
        return self.matcher.is_terminated()

    def jump_forward(self) -> list[int]:
        """The tokens that spell the text the grammar forces next (xgrammar's longest-match
        tokenization of it; empty when the next character is free)."""
        return list(self.matcher.find_jump_forward_tokens())

    def jump_forward_after(self, path: list[int]) -> list[int]:
        """`jump_forward` after the tokens `path` (a draft tree node's, not committed: the state is
        left as it was); empty where the grammar forbids the path."""
        taken = 0
        for t in path:
            if not self.matcher.accept_token(int(t)):
                break
            taken += 1
        out = list(self.matcher.find_jump_forward_tokens()) if taken == len(path) else []
        if taken:
            self.matcher.rollback(taken)
        return out

    def mask(self) -> np.ndarray:
        """[1, W] the tokens allowed next."""
        out = torch.zeros(1, words(self.vocab_size), dtype=torch.int32)
        self.matcher.fill_next_token_bitmask(out, 0)
        return out.numpy()

    def tree_masks(self, tokens: list[int], parents: list[int]) -> np.ndarray:
        """See `_tree_masks`; the last tree's are kept until the state moves, and serve it and its
        prefixes (a round's tree is masked when pruned, cut to size, when its forced tokens settle,
        and by the sampler)."""
        n, key = len(tokens), (tuple(tokens), tuple(parents[1:]))  # (a root's parent: -1 in a tree, 0 packed)
        if self._last is not None:
            (tokens_, parents_), masks = self._last
            if tokens_[:n] == key[0] and parents_[:n - 1] == key[1]:  # that tree or a prefix of it (a size cut)
                return masks[:n]
        self._last = key, self._tree_masks(tokens, parents)
        return self._last[1]

    def remember(self, tokens: list[int], parents: list[int], masks: np.ndarray) -> None:
        """Keep `masks` as this tree's (a subtree of the last tree: its nodes' rows, same paths)."""
        self._last = (tuple(tokens), tuple(parents[1:])), masks

    def _tree_masks(self, tokens: list[int], parents: list[int]) -> np.ndarray:
        """[n, W] the tokens allowed after each node of a draft tree (nodes parents first, node 0 the
        root: the last committed token, already accepted): row i after the path of node i's
        ancestors below the root and i itself. A node the grammar forbids, and every node below it,
        gets an all-zero row. The state is left as it was."""
        n = len(tokens)
        first, sibling = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        last: dict[int, int] = {}
        for i in range(1, n):  # first-child / next-sibling encoding, siblings in node order
            p = parents[i]
            if p in last:
                sibling[last[p]] = i
            else:
                first[p] = i
            last[p] = i
        out = torch.zeros(n, words(self.vocab_size), dtype=torch.int32)
        self.matcher.traverse_draft_tree(torch.from_numpy(first), torch.from_numpy(sibling),
                                         torch.tensor(tokens, dtype=torch.int64), out)
        return out.numpy()


def allows(mask: np.ndarray, token: int) -> bool:
    """Whether one mask row [W] allows `token`."""
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def allowed_tokens(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The token ids one mask row [W] allows, ascending."""
    bits = np.unpackbits(np.ascontiguousarray(mask, dtype=np.int32).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def forced(mask: np.ndarray, vocab_size: int) -> int | None:
    """The one token a mask row [W] allows, or None when it allows several (or none)."""
    if np.bitwise_count(mask.view(np.uint32)).sum() > 1 + 32:  # (bits past the vocabulary may be set)
        return None
    ids = allowed_tokens(mask, vocab_size)
    return int(ids[0]) if len(ids) == 1 else None


def apply_masks(logits: torch.Tensor, masks: np.ndarray) -> None:
    """Set the logits [n, V] (float32, contiguous rows, in place) of every token its row's mask
    [n, W] forbids to -inf. A row that allows nothing is left as it is: its node follows the
    grammar's stop token, where the output ends, so its draw is never emitted (and must not read as
    "no valid token"). On the CPU one numpy `copyto` over the forbidden bits: 180 µs for 16 rows of
    49,152 where torch's `masked_fill_` took 430 (benchmarks/structured_2026-12-06)."""
    V = logits.shape[-1]
    masks = np.ascontiguousarray(masks, dtype=np.int32)
    banned = np.unpackbits((~masks).view(np.uint8), axis=-1, bitorder="little")[:, :V].view(np.bool_)  # [n, V]
    banned[~masks.any(axis=-1)] = False
    if logits.device.type == "cpu":
        np.copyto(logits.numpy(), -np.inf, where=banned)
    else:
        logits.masked_fill_(torch.from_numpy(banned).to(logits.device), float("-inf"))
