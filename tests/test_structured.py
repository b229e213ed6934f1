"""Structured output (a JSON schema, any JSON object, a regex, a grammar) under speculation: each
tree node's row is masked along its own path, drafts the grammar forbids are pruned and tokens it
forces are added, so greedy output equals plain decoding's for every method (C=1 and C=8, tau > 1)
and sampled output matches the masked target's exact distribution (with negative controls). Plus
the tree surgery against a token-by-token walk, outputs that validate, and bad specs refused."""
import json

import jsonschema
import numpy as np
import pytest
import torch

from flashtree import LLM, SamplingParams, StructuredOutput
from flashtree.engine.sampler import Sampler
from flashtree.errors import RequestError, UserError
from flashtree.grammar import Grammars, allowed_tokens, apply_masks, forced
from flashtree.measure.exactness import (
    P_MIN,
    Cell,
    check_cell,
    chi_square_pooled,
    exact_distribution,
    position_check,
    sample_sequences,
    tiny_pair,
)
from flashtree.speculative.constrained import force, prune
from flashtree.speculative.tree import DraftTree

METHODS = ("ar", "ngram", "dflash", "ddtree", "hybrid")
PROMPTS = ["def main(", "import os\n", "class Tree:\n    def __init__(self", "for i in range(",
           "def fib(n):", "with open(path) as f:", "try:\n    import numpy", "x = [i * i for i in"]  # C=8
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "size": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "self"]},
                                                    "maxItems": 3}},
          "required": ["name", "size", "tags"], "additionalProperties": False}
TOY = ["a", "b", "c", "d", "e", "f", "g", "<m>"]  # the tiny pair's vocabulary (token 7: the drafter's mask)
TOY_REGEX = "(ab|[cde])+"  # first a, c, d or e; after an a only b (forced); never f or g
PAIRS = "(a[bcd]|[bc][abd])+"  # first {a, b, c}, second {b, c, d} or {a, b, d}: never a forced or dead end


@pytest.fixture(scope="module")
def toy():
    return Grammars.from_vocab(TOY, [])


def walk_masks(grammars, so, tree: DraftTree) -> list[list[int]]:
    """Each node's allowed tokens by feeding its path token by token to a fresh state ([] where the
    path breaks the grammar)."""
    out = []
    for i in range(tree.size):
        path, j = [], i
        while j > 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        state = grammars.start(so)
        try:
            for t in reversed(path):
                state.accept(t)
        except RuntimeError:
            out.append([])
            continue
        out.append(allowed_tokens(state.mask()[0], len(TOY)).tolist())
    return out


def test_tree_masks_equal_a_token_by_token_walk(toy):
    so = StructuredOutput(regex=TOY_REGEX)
    #          0  1:a 2:c 3:b(of a) 4:c(of a, forbidden) 5:a(of 4) 6:f(of c, forbidden) 7:d(of c)
    tree = DraftTree([6, 0, 2, 1, 2, 0, 5, 3], [-1, 0, 0, 1, 1, 4, 2, 2], [0, 1, 1, 2, 2, 3, 2, 2], [0.0] * 8)
    state = toy.start(so)
    masks = state.tree_masks(tree.tokens, tree.parents)
    assert [allowed_tokens(m, len(TOY)).tolist() for m in masks] == walk_masks(toy, so, tree)
    assert allowed_tokens(masks[0], 8).tolist() == [0, 2, 3, 4] and forced(masks[1], 8) == 1
    assert forced(masks[0], 8) is None and allowed_tokens(masks[4], 8).size == 0
    state.accept(2)  # the state is where it was: it takes a c
    logits = torch.zeros(2, 8)
    apply_masks(logits, masks[[0, 1]])
    assert torch.isinf(logits[0, [1, 5, 6, 7]]).all() and torch.isfinite(logits[0, [0, 2, 3, 4]]).all()
    assert torch.isfinite(logits[1]).tolist() == [t == 1 for t in range(8)]


def test_prune_drops_forbidden_subtrees_and_force_adds_the_forced_tokens(toy):
    so = StructuredOutput(regex=TOY_REGEX)
    tree = DraftTree([6, 0, 2, 2, 0, 5, 3], [-1, 0, 0, 1, 3, 2, 2], [0, 1, 1, 2, 3, 2, 2],
                     [0.0, -0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    pruned = prune(tree, toy.start(so))  # c under a (and its a) and f under c go
    assert (pruned.tokens, pruned.parents, pruned.depths) == ([6, 0, 2, 3], [-1, 0, 0, 2], [0, 1, 1, 2])
    assert pruned.logprobs == [0.0, -0.1, -0.2, -0.6]
    grown = force(pruned, toy.start(so), rows=8, depth=4)  # a forces b: added right after the a
    assert (grown.tokens, grown.parents, grown.depths) == ([6, 0, 1, 2, 3], [-1, 0, 1, 0, 3], [0, 1, 2, 1, 2])
    assert grown.logprobs[2] == 0.0
    chain = force(DraftTree([6, 0], [-1, 0], [0, 1], [0.0, -0.1]), toy.start(so), rows=8, depth=1)
    assert chain.tokens == [6, 0]  # no deeper than `depth`
    assert force(tree, toy.start(so), rows=3, depth=4).size == 3  # nor more than `rows` nodes
    state = toy.start(so)
    state.accept(0)
    assert force(DraftTree([0], [-1], [0], [0.0]), state, rows=4, depth=3).tokens == [0, 1]  # a root forcing


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny-code", dtype="float32", compile=False, max_batch_size=8)


def reference_decode(llm, prompt: str, params: SamplingParams) -> list[int]:
    """Greedy decoding by uncached forwards, each step's logits masked by a state fed the output so
    far (no engine)."""
    prompt_ids = llm.tokenizer.encode(prompt)
    state = llm.engine.grammars.start(params.structured)
    out: list[int] = []
    while len(out) < params.max_tokens and not state.terminated:
        ids = torch.tensor([prompt_ids + out])
        with torch.inference_mode():
            hidden, _ = llm.target(ids, torch.arange(ids.shape[1])[None])
            logits = llm.target.logits(hidden[0, -1]).float()[None]
            apply_masks(logits, state.mask())
        out.append(int(logits.argmax()))
        state.accept(out[-1])
    return out


@pytest.mark.parametrize("method", METHODS)
def test_greedy_under_a_json_schema_equals_plain_decoding(llm, method):
    params = SamplingParams(temperature=0, max_tokens=96, structured=StructuredOutput(json_schema=SCHEMA))
    plain = llm.generate(PROMPTS, params, use_tqdm=False, method="ar")
    outs = llm.generate(PROMPTS, params, use_tqdm=False, method=method)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    alone = llm.generate(PROMPTS[:1], params, use_tqdm=False, method=method)   # C=1
    assert alone[0].token_ids == outs[0].token_ids
    for o in outs:  # every output that ended by its grammar (not max_tokens) is valid
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), SCHEMA)
    assert sum(o.finish_reason == "stop" for o in outs) >= 6
    if method == "ar":
        assert outs[0].token_ids == reference_decode(llm, PROMPTS[0], params)
    else:
        taus = [t for o in outs + alone for t in o.metrics.accept_lengths]
        assert sum(taus) / len(taus) > 1


def test_grammar_aware_drafts_pay_on_the_same_outputs(llm):
    """Pruned, over-drafted and forced drafts against masks only (grammar_drafts=False): the same
    greedy outputs, and tau at least as high (the pruned prefix holds every valid node of the plain
    tree, and more)."""
    masks_only = LLM("tiny-code", dtype="float32", compile=False, max_batch_size=8, grammar_drafts=False)
    params = SamplingParams(temperature=0, max_tokens=96, structured=StructuredOutput(json_schema=SCHEMA))
    on = llm.generate(PROMPTS, params, use_tqdm=False, method="ddtree", budget=8)
    off = masks_only.generate(PROMPTS, params, use_tqdm=False, method="ddtree", budget=8)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]

    def tau(outs):
        taus = [t for o in outs for t in o.metrics.accept_lengths]
        return sum(taus) / len(taus)
    assert tau(on) > tau(off) > 1, (tau(on), tau(off))


@pytest.mark.parametrize("so", [StructuredOutput(regex=r"(0x[0-9a-f]{2}, ){3}[A-Z][a-z]+\."),
                                StructuredOutput(grammar='root ::= "[" item ("," item)* "]"\n'
                                                         'item ::= "x" | "yy" | [0-9]+'),
                                StructuredOutput(json_object=True)], ids=["regex", "grammar", "json_object"])
@pytest.mark.parametrize("method", ["dflash", "ddtree"])
def test_greedy_under_a_regex_or_grammar_equals_plain_decoding(llm, so, method):
    params = SamplingParams(temperature=0, max_tokens=40, structured=so)
    plain = llm.generate(PROMPTS, params, use_tqdm=False, method="ar")
    outs = llm.generate(PROMPTS, params, use_tqdm=False, method=method)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    if so.regex is not None:
        import re
        assert all(re.fullmatch(so.regex, o.text) for o in outs if o.finish_reason == "stop")
    if so.json_object:
        assert all(isinstance(json.loads(o.text), dict) for o in outs if o.finish_reason == "stop")


def test_a_grammar_ends_the_output_even_with_ignore_eos(llm):
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, structured=StructuredOutput(regex="ab?c"))
    out = llm.generate(PROMPTS[:2], params, use_tqdm=False, method="ddtree")
    assert all(o.finish_reason == "stop" and o.text in ("ac", "abc") for o in out)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, seed=0, block_size=3)


@pytest.mark.parametrize("method, budget, temperature, regex", [
    pytest.param("ddtree", 6, 0.6, TOY_REGEX, marks=pytest.mark.slow), ("ddtree", 6, 1.0, TOY_REGEX),
    pytest.param("dflash", None, 0.6, TOY_REGEX, marks=pytest.mark.slow), ("dflash", None, 1.0, TOY_REGEX),
    ("ddtree", 6, 1.0, PAIRS),
    pytest.param("hybrid", 6, 1.0, TOY_REGEX, marks=pytest.mark.slow),
    pytest.param("ngram", None, 0.6, TOY_REGEX, marks=pytest.mark.slow)])
def test_sampled_output_has_the_masked_targets_distribution(pair, toy, method, budget, temperature, regex):
    params = SamplingParams(temperature=temperature, structured=StructuredOutput(regex=regex))
    cell = Cell(method, budget, params, n=20_000)
    check_cell(*pair, [1, 2, 3], cell, n_tokens=4, grammars=toy)
    assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit)
    assert cell.mean_accept_length > 1.0


@pytest.mark.parametrize("method, budget, temperature", [
    ("ddtree", 8, 0.6), pytest.param("dflash", None, 1.0, marks=pytest.mark.slow)])
def test_sampled_json_follows_the_masked_targets_next_token_distribution(llm, method, budget, temperature):
    """A real vocabulary under a JSON schema: among runs that agree on their first k tokens, token k
    follows the masked target's exact distribution after them (positions 1-3 come out of verified
    trees), tau > 1."""
    params = SamplingParams(temperature=temperature, structured=StructuredOutput(json_schema=SCHEMA))
    prompt = llm.tokenizer.encode(PROMPTS[0])
    check = position_check(llm.target, llm.drafter, prompt, params, method, budget, n=2000, min_count=200,
                           grammars=llm.engine.grammars)
    assert check.passed and len(check.tests) >= 3, (check.tests, check.mean_accept_length)


class RootMaskToo(Sampler):
    """A wrong sampler: every node's row masked after its own path and also by the grammar's state
    at the root (the committed output): still valid output, a different distribution below the root."""

    def adjusted(self, seqs, logits, spans, vin=None):
        out = super().adjusted(seqs, logits, spans, vin)
        for s, (lo, hi) in zip(seqs, spans):
            apply_masks(out[lo:hi], np.repeat(s.grammar.mask(), hi - lo, axis=0))
        return out


def test_masks_that_ignore_the_nodes_paths_are_caught(pair, toy):
    """Negative control: with PAIRS the root's mask drops d below the root wherever the node's own
    path allows it (never every token); the same test as above rejects the samples."""
    cell = Cell("ddtree", 6, SamplingParams(temperature=1.0, structured=StructuredOutput(regex=PAIRS)), n=20_000)
    check_cell(*pair, [1, 2, 3], cell, n_tokens=4, grammars=toy,
               patch=lambda eng: setattr(eng, "sampler", RootMaskToo(eng.device)))  # the engine's sampler seam
    assert cell.rejected(), (cell.p_value, cell.tv, cell.tv_limit, cell.mean_accept_length)


def test_an_engine_ignoring_the_grammar_is_caught(pair, toy):
    """Negative control: unconstrained samples against the masked target's exact distribution."""
    target, drafter = pair
    params = SamplingParams(temperature=1.0, structured=StructuredOutput(regex=TOY_REGEX))
    exact = exact_distribution(target, [1, 2, 3], params, 4, toy)
    counts = sample_sequences(target, drafter, [1, 2, 3], SamplingParams(temperature=1.0), "ddtree", 6,
                              20_000, 4).counts
    assert chi_square_pooled(counts, exact, 20_000) < P_MIN


@pytest.mark.parametrize("so, match", [
    (dict(json_schema={"type": "objekt"}), "json schema cannot be compiled"),
    (dict(regex="(ab"), "regex cannot be compiled"),
    (dict(grammar="root ::= missing"), "grammar cannot be compiled"),
])
def test_a_spec_the_compiler_rejects_is_refused_when_added(llm, so, match):
    with pytest.raises(RequestError, match=match):
        llm.generate(PROMPTS[:1], SamplingParams(structured=StructuredOutput(**so)), use_tqdm=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "exactly one of"), (dict(regex="a", grammar="root ::= \"a\""), "exactly one of"),
    (dict(regex=""), "regex must be a non-empty string"), (dict(json_schema=3), "json_schema must be"),
])
def test_bad_structured_values_are_refused(kwargs, match):
    with pytest.raises(UserError, match=match):
        StructuredOutput(**kwargs)
    with pytest.raises(UserError, match="structured must be"):
        SamplingParams(structured={"regex": "a"})


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_sampled_drafts_end_at_the_grammars_stop_token(llm, method):
    """Under a finished grammar the drafts carry its stop token (forced) and the rows below it allow
    nothing; the output ends there cleanly, never as "no valid token"."""
    params = [SamplingParams(temperature=0.8, seed=s, max_tokens=64, structured=StructuredOutput(json_object=True))
              for s in range(6)]
    outs = llm.generate(PROMPTS[:6], params, use_tqdm=False, method=method)
    assert all(o.finish_reason in ("stop", "length") for o in outs), [o.finish_reason for o in outs]
    assert all(isinstance(json.loads(o.text), dict) for o in outs if o.finish_reason == "stop")
    assert sum(o.finish_reason == "stop" for o in outs) >= 3


def test_a_forced_string_is_drafted_as_a_chain_below_the_root():
    """After "c" the regex forces "ab", which "a" "b" or "ab" spell: no single token is forced, so
    the longest-match tokens go in as a chain (merged with a drafted match, ahead of later nodes)."""
    vocab = Grammars.from_vocab(["a", "b", "ab", "c", "d", "<m>"], [])
    so = StructuredOutput(regex="cab(c|d)+")
    start = vocab.start(so)
    assert start.jump_forward() == [3, 2]
    grown = force(DraftTree([5], [-1], [0], [0.0]), start, rows=8, depth=4)
    assert (grown.tokens, grown.parents, grown.depths) == ([5, 3, 2], [-1, 0, 1], [0, 1, 2])
    #                 root  c   a (a draft after c)  d (a draft after a: pruned)
    drafted = DraftTree([5, 3, 0, 4], [-1, 0, 1, 2], [0, 1, 2, 3], [0.0, -0.1, -0.2, -0.3])
    grown = force(prune(drafted, vocab.start(so)), vocab.start(so), rows=8, depth=4)
    # c followed; "ab" right after it; the drafted a keeps its place below c and gets its forced b
    assert (grown.tokens, grown.parents, grown.depths) == ([5, 3, 2, 0, 1], [-1, 0, 1, 1, 3], [0, 1, 2, 2, 3])
    assert force(DraftTree([5], [-1], [0], [0.0]), vocab.start(so), rows=8, depth=1).tokens == [5, 3]


def test_a_string_forced_after_a_likely_leaf_is_drafted_below_it():
    """After a first "c" or "d" the regex forces "ab": nothing is forced at the root, so the string
    goes in below the likeliest leaves (each leaf's own path walked and undone), ahead of later nodes."""
    vocab = Grammars.from_vocab(["a", "b", "ab", "c", "d", "<m>"], [])
    so = StructuredOutput(regex="(c|d)ab(c|d)+")
    state = vocab.start(so)
    assert state.jump_forward() == [] and state.jump_forward_after([4]) == [2]
    assert state.jump_forward_after([0]) == []  # a path the grammar forbids: nothing
    mask = state.mask().copy()
    #                root  c     d
    drafted = DraftTree([5, 3, 4], [-1, 0, 0], [0, 1, 1], [0.0, -0.1, -0.5])
    grown = force(drafted, state, rows=8, depth=4)
    assert (grown.tokens, grown.parents, grown.depths) == ([5, 3, 2, 4, 2], [-1, 0, 1, 0, 3], [0, 1, 2, 1, 2])
    assert force(drafted, state, rows=4, depth=4).size == 4  # within `rows`: the likelier leaf's string only
    assert force(drafted, state, rows=4, depth=4).tokens == [5, 3, 2, 4]
    assert np.array_equal(state.mask(), mask) and state.jump_forward() == []  # the state is where it was
