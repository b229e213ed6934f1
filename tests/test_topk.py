"""The DDTree branching cap `topk` (SGLang's --speculative-eagle-topk): the builder, the engine,
LLM(topk=...), the CLI's --topk, the request's speculative.topk and usage.spec.topk."""
from __future__ import annotations

import itertools
import json
import socket

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtree import LLM, SamplingParams
from flashtree.cli import main
from flashtree.engine.engine import RequestError
from flashtree.errors import UserError
from flashtree.speculative.tree import build_ddtree, chain_tree
from serving import Running


def children(tree) -> list[int]:
    counts = [0] * tree.size
    for p in tree.parents[1:]:
        counts[p] += 1
    return counts


def ranked(lp: np.ndarray):
    order = np.argsort(-lp, axis=1, kind="stable")
    return np.take_along_axis(lp, order, 1), order


# ------------------------------------------------------------------------------------ the builder
@st.composite
def capped_drafts(draw):
    L, V = draw(st.integers(1, 4)), draw(st.integers(2, 5))
    vals = draw(st.lists(st.integers(-40, 0), min_size=L * V, max_size=L * V, unique=True))
    return np.array(vals, dtype=np.float64).reshape(L, V) / 7.0, draw(st.integers(1, 30)), draw(st.integers(1, 6))


@settings(max_examples=200, deadline=None)
@given(capped_drafts())
def test_capped_tree_is_the_top_budget_prefixes_over_the_top_topk_ranks(case):
    lp, budget, topk = case
    L, V = lp.shape
    top_lp, top_ids = ranked(lp)
    tree = build_ddtree(99, top_lp, top_ids, budget, topk)
    assert max(children(tree)) <= topk
    k = min(topk, V)
    assert tree.size - 1 == min(budget, sum(k ** d for d in range(1, L + 1)))
    # brute force over rank tuples < topk: the tree holds the `budget` best-scoring prefixes
    scores = sorted((sum(top_lp[d, r] for d, r in enumerate(ranks))
                     for depth in range(1, L + 1) for ranks in itertools.product(range(k), repeat=depth)),
                    reverse=True)
    got = sorted((_score(tree, i) for i in range(1, tree.size)), reverse=True)
    assert np.allclose(got, scores[:tree.size - 1])


def _score(tree, i: int) -> float:
    s = 0.0
    while i > 0:
        s, i = s + tree.logprobs[i], tree.parents[i]
    return s


@settings(max_examples=100, deadline=None)
@given(capped_drafts())
def test_topk_1_is_the_chain_of_per_depth_argmaxes(case):
    lp, _, _ = case
    L = lp.shape[0]
    top_lp, top_ids = ranked(lp)
    chain = chain_tree(7, top_ids[:, 0].tolist(), top_lp[:, 0].tolist())  # what dflash verifies
    for budget in (L, L + 5):
        t = build_ddtree(7, top_lp, top_ids, budget, topk=1)
        assert (t.tokens, t.parents, t.depths, t.logprobs) == (chain.tokens, chain.parents, chain.depths, chain.logprobs)
    short = build_ddtree(7, top_lp, top_ids, 1, topk=1)  # a budget below the depth: the chain's head
    assert short.tokens == chain.tokens[:2]


def test_no_cap_and_a_cap_at_the_width_build_the_same_tree():
    lp = np.log(np.array([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]))
    ids = np.array([[4, 5, 6], [7, 8, 9]])
    assert build_ddtree(0, lp, ids, 8).tokens == build_ddtree(0, lp, ids, 8, topk=3).tokens
    two = build_ddtree(0, lp, ids, 8, topk=2)
    assert max(children(two)) == 2 and 6 not in two.tokens and 9 not in two.tokens
    with pytest.raises(ValueError, match="topk"):
        build_ddtree(0, lp, ids, 8, topk=0)


# ------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def llm(tiny_pair):
    return LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ddtree", budget=7, dtype="float32", device="cpu",
               max_batch_size=4)


PROMPTS = [[5, 9, 2], [17, 3, 44, 8, 1, 90, 12], [60]]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _rounds(llm, **kw):
    llm.engine.round_log = []
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, **kw)
    log, llm.engine.round_log = llm.engine.round_log, None
    return outs, log


def test_topk_1_verifies_exactly_dflashs_chains_and_greedy_equals_ar(llm):
    ar = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False, method="ar")]
    dflash, dlog = _rounds(llm, method="dflash")
    chain, clog = _rounds(llm, budget=7, topk=1)  # block 8: 7 draft slots, so the whole chain fits
    assert [o.token_ids for o in chain] == [o.token_ids for o in dflash] == ar
    assert len(clog) == len(dlog) > 0
    for c, d in zip(clog, dlog):
        assert (c.req_id - clog[0].req_id, c.tree.tokens, c.tree.parents, c.tree.logprobs) == \
               (d.req_id - dlog[0].req_id, d.tree.tokens, d.tree.parents, d.tree.logprobs)
        assert c.path == d.path


@pytest.mark.parametrize("topk", [1, 2, 3])
def test_no_node_has_more_than_topk_children_and_greedy_equals_ar(llm, topk):
    ar = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False, method="ar")]
    outs, log = _rounds(llm, budget=7, topk=topk)
    assert [o.token_ids for o in outs] == ar
    widest = max(max(children(e.tree)) for e in log)
    assert widest == topk  # the cap is reached (a random drafter's depth-1 spread is wide) and never passed
    _, uncapped = _rounds(llm, budget=7)
    assert max(max(children(e.tree)) for e in uncapped) > 3  # without a cap the root fans out wider


def test_the_engine_default_cap_applies_and_a_request_overrides_it(tiny_pair):
    llm = LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ddtree", budget=6, topk=1, dtype="float32",
              device="cpu")
    llm.engine.round_log = []
    llm.generate([[3, 4]], GREEDY, use_tqdm=False)
    llm.generate([[3, 4]], GREEDY, use_tqdm=False, topk=4)
    llm.generate([[3, 4]], GREEDY, use_tqdm=False, budget=2)  # the default cap within a smaller budget
    by_req = {}
    for e in llm.engine.round_log:
        by_req.setdefault(e.req_id, []).append(max(children(e.tree)))
    assert [max(v) for _, v in sorted(by_req.items())] == [1, 4, 1]


def test_target_drafts_walk_deep_under_a_cap():
    """Drafts that are the target's own greedy chain are accepted deep: the cap keeps the walk exact."""
    from flashtree.engine.engine import Engine, EngineConfig
    from flashtree.measure.exactness import target_drafts, tiny_pair
    target, drafter = tiny_pair(vocab=8, block_size=4)
    outs = {}
    for method, topk in (("ar", None), ("ddtree", 1), ("ddtree", 2)):
        eng = Engine(target, drafter, EngineConfig(method=method, budget=6 if topk else None, topk=topk,
                                                   max_model_len=40))
        target_drafts(target)(eng)
        seq = eng.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        while eng.has_work():
            eng.step()
        outs[method, topk] = seq.output_ids
        if topk:
            assert seq.metrics.mean_accept_length > 2  # deep paths really were verified and committed
    assert outs["ddtree", 1] == outs["ddtree", 2] == outs["ar", None]


# ------------------------------------------------------------------------------------ validation
def test_topk_is_validated_with_a_clear_error(llm, tiny_pair):
    for bad in (0, 8, -1, True, 2.0):
        with pytest.raises(RequestError, match=r"topk .*must be an integer in \[1, budget=7\]") as e:
            llm.generate([[1, 2]], GREEDY, use_tqdm=False, topk=bad)
        assert e.value.param == "speculative"
    with pytest.raises(RequestError, match="budget=3"):
        llm.generate([[1, 2]], GREEDY, use_tqdm=False, budget=3, topk=4)
    with pytest.raises(RequestError, match="topk applies to method 'ddtree' only"):
        llm.generate([[1, 2]], GREEDY, use_tqdm=False, method="dflash", topk=1)
    assert not llm.engine.has_work()
    with pytest.raises(UserError, match=r"topk .*\[1, budget=4\]"):
        LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ddtree", budget=4, topk=5, device="cpu")
    with pytest.raises(UserError, match="topk applies to method 'ddtree' only"):
        LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ar", topk=1, device="cpu")


@pytest.mark.parametrize("argv, message", [
    (["--method", "ddtree", "--topk", "0"], "--topk must be in [1, 32]"),  # budget "auto" drafts up to 32 nodes
    (["--method", "ddtree", "--budget", "4", "--topk", "5"], "--topk must be in [1, 4]"),
    (["--topk", "2"], "--method hybrid has no tree"),  # the default method takes no cap
    (["--method", "dflash", "--topk", "1"], "--topk caps the branching of a DDTree"),
])
def test_cli_rejects_a_bad_topk(tiny_pair, argv, message, capsys):
    for cmd in (["generate", "t1"], ["serve"], ["trace", "t1"]):
        assert main([*cmd, "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_cli_generate_and_trace_take_topk(tiny_pair, tmp_path, capsys):
    model = ["--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1])]
    assert main(["generate", "t1 t2", *model, "--method", "ddtree", "--budget", "7", "--topk", "1", "--max-tokens", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 8
    page = tmp_path / "t.html"
    assert main(["trace", "t1 t2", *model, "--method", "ddtree", "--budget", "7", "--topk", "2", "--max-tokens", "8", "--out", str(page)]) == 0
    text = page.read_text()
    assert "<b>topk</b><span>2</span>" in text and '"topk": 2' in text


# ------------------------------------------------------------------------------------ HTTP
@pytest.fixture(scope="module")
def server(llm):
    from flashtree.server.app import create_app
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    r = Running(create_app(llm, model_name="tiny"), sock)
    yield r
    r.stop()


def _post(server, **body):
    return httpx.post(server.base + "/v1/completions", timeout=60,
                      json={"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0, "ignore_eos": True, **body})


def test_request_topk_shows_in_usage_and_keeps_greedy(server, llm):
    ar = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                      use_tqdm=False, method="ar")[0].text
    r = _post(server, speculative={"topk": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["spec"]["topk"] == 1 and r.json()["choices"][0]["text"] == ar
    r = _post(server, speculative={"budget": 4, "topk": 3})
    assert r.json()["usage"]["spec"]["topk"] == 3 and r.json()["choices"][0]["text"] == ar
    assert _post(server).json()["usage"]["spec"]["topk"] is None  # this server sets no cap
    assert _post(server, speculative={"method": "ar"}).json()["usage"]["spec"]["topk"] is None


@pytest.mark.parametrize("spec, message", [
    ({"topk": 0}, "[1, budget=7]"), ({"topk": 8}, "[1, budget=7]"), ({"budget": 2, "topk": 3}, "[1, budget=2]"),
    ({"method": "dflash", "topk": 1}, "topk applies to method 'ddtree' only"), ({"topk": "2"}, "speculative.topk"),
])
def test_bad_request_topk_is_a_400_naming_speculative(server, spec, message):
    r = _post(server, speculative=spec)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["param"].startswith("speculative")
