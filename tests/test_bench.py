"""`flashtree bench` on a tiny random pair: the report's numbers must agree with each other."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import statistics
from pathlib import Path

import pytest

from flashtree.cli import build_parser, main
from flashtree.measure.bench import (
    BenchPlan,
    ComponentCosts,
    Config,
    Pass,
    component_costs,
    pass_order,
    portable_path,
    slices,
    summarize_group,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pair(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    prompts = tmp_path_factory.mktemp("bench") / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": " ".join(f"t{(7 * i + j) % 90 + 1}" for j in range(5 + i))})
                               + "\n" for i in range(3)))
    return target, draft, prompts


@pytest.fixture(scope="module")
def bench(pair, tmp_path_factory):
    target, draft, prompts = pair
    out = tmp_path_factory.mktemp("bench_out")
    argv = ["bench", "--model", str(target), "--draft", str(draft), "--prompts", str(prompts),
            "--num-prompts", "2", "--max-tokens", "6", "--methods", "ar,dflash,ddtree", "--budgets", "3,auto",
            "--temperatures", "0,1", "--concurrency", "1,2", "--repeats", "2", "--warmup", "0", "--out", str(out),
            "--exact-samples", "2000", "--slice-prompts", "1"]  # C=1: two slices a repeat, joined
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    return rc, out, json.loads((out / "bench.json").read_text()), buf.getvalue()


def test_bench_writes_consistent_report(bench):
    rc, out, rep, stdout = bench
    assert rc == 0
    meta, cells, peers = rep["meta"], rep["cells"], rep["peers"]
    assert meta["num_prompts"] == 2 and meta["max_tokens"] == 6 and meta["repeats"] == 2
    assert meta["slice_prompts"] == 1
    assert meta["versions"]["torch"]
    assert len(cells) == 2 * 2 * 4 and len(peers) == 2 * 2
    assert {c["label"] for c in cells} == {"ar", "dflash", "ddtree@3", "ddtree@auto"}
    for a in rep["auto_costs"]:  # auto's table as each group left it, its price corrections included
        assert a["verify_ms"] and a["draft_ms"] and all(e > 0 for e in a["error"].values())
        assert a["context_row_ms"] is None or a["context_row_ms"] >= 0
    expected_tokens = 2 * 2 * 6  # repeats x prompts x max_tokens (ignore_eos)
    for c in cells:
        assert c["completion_tokens"] == expected_tokens
        assert len(c["tok_s_runs"]) == 2 and c["tok_s"] == pytest.approx(statistics.median(c["tok_s_runs"]))
        for tok_s, sec in zip(c["tok_s_runs"], c["seconds_runs"]):
            assert tok_s == pytest.approx(expected_tokens / 2 / sec)
        h = c["accept_length_histogram"]
        assert len(h) == meta["block_size"] == 8
        assert sum(h) == c["rounds"] > 0
        # every token but each prompt's first (from prefill) was committed by a round
        assert sum((k + 1) * n for k, n in enumerate(h)) == expected_tokens - 2 * 2
        assert c["mean_accept_length"] == pytest.approx(sum((k + 1) * n for k, n in enumerate(h)) / c["rounds"])
        ar = next(a for a in cells if a["method"] == "ar" and a["temperature"] == c["temperature"]
                  and a["concurrency"] == c["concurrency"])
        assert c["speedup_vs_ar"] == pytest.approx(c["tok_s"] / ar["tok_s"])
        # paired: each repeat's pass against ar's pass of the same repeat, then the median
        pairs = [t / a for t, a in zip(c["tok_s_runs"], ar["tok_s_runs"])]
        assert c["speedup_runs"] == pytest.approx(pairs) and c["speedup_paired"] == pytest.approx(statistics.median(pairs))
        if c["method"] != "ar":  # pooled: every repeat's tokens over its seconds, against ar's, and an interval around it
            rate = lambda cell: sum(t * s for t, s in zip(cell["tok_s_runs"], cell["seconds_runs"])) / sum(cell["seconds_runs"])
            lo, hi = c["speedup_pooled_95"]
            assert c["speedup_pooled"] == pytest.approx(rate(c) / rate(ar)) and lo <= c["speedup_pooled"] <= hi
        if c["budget"] == "auto":  # its chosen sizes and expected tau, and no bound (its tree changes every round)
            assert 0 <= c["mean_budget"] <= 32 and c["predicted_tau"] >= 1
            assert c["bound"] is None and c["costs_ms"]["tree_size"] is None and c["costs_ms"]["draft"] > 0
        else:
            assert c["mean_budget"] is None and c["bound_share"] == pytest.approx(c["speedup_vs_ar"] / c["bound"])
        if c["method"] == "ar":
            assert h[0] == c["rounds"] and c["bound"] == 1.0 and c["speedup_vs_ar"] == pytest.approx(1.0)
        elif c["budget"] != "auto":
            k = c["costs_ms"]
            assert k["draft"] > 0 and k["verify"] > 0 and k["c1"] > 0
            assert k["tree_size"] == {"dflash": 8, "ddtree": 4}[c["method"]]
            assert c["bound"] == pytest.approx(c["mean_accept_length"] * k["c1"] / (k["draft"] + k["verify"]))
        x = c["exact"]  # greedy identity at T=0 (2 prompts x 2 repeats); at T=1 the chi-square cell and
        if c["method"] == "ar":  # the seeded outputs equal to plain decoding's
            assert x["check"] == "reference"
        elif c["temperature"] == 0:
            assert x == {"check": "greedy identity", "passed": True, "identical": 4, "outputs": 4}
        else:
            assert x["check"] == "chi-square cell" and x["passed"] and x["samples"] == 2000
            assert (x["identical"], x["outputs"]) == (4, 4)
        # concurrency C: at most C sequences per engine step (1: every step runs one sequence's round)
        assert (c["steps"] == c["rounds"]) == (c["concurrency"] == 1), (c["label"], c["steps"], c["rounds"])
        if c["concurrency"] == 1:  # peers run at batch 1 and are compared with the batch-1 cells
            for q in peers:
                if q["temperature"] == c["temperature"]:
                    assert c["speedup_vs_peers"][q["name"]] == pytest.approx(c["tok_s"] / q["tok_s"])
        else:
            assert c["speedup_vs_peers"] == {}
    for q in peers:
        assert q["name"] in ("hf_generate", "hf_prompt_lookup") and q["tok_s"] > 0
        assert q["completion_tokens"] == expected_tokens
    assert "ddtree@3" in stdout and "hf_prompt_lookup" in stdout
    assert stdout.splitlines()[0].split()[:8] == ["temp", "conc", "config", "tok/s", "tau", "pred", "N", "exact"]
    assert "yes 4/4" in stdout and "yes p=" in stdout and " ref " in stdout and "ddtree@auto" in stdout


def test_bench_writes_pngs_and_markdown(bench):
    import matplotlib.image as mpimg
    _, out, _, _ = bench
    for name in ("speedup_vs_budget", "tau_histogram", "toks_vs_concurrency"):
        path = out / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(path)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0.01  # not blank
        assert f"({name}.png)" in (out / "report.md").read_text()


def test_bound_from_isolated_component_costs():
    # isolated: plain forward 10 ms, 5-token forward 15 ms, draft pass 5 ms; ddtree tau 3 -> 3 * 10 / 20 = 1.5
    costs = ComponentCosts(forward={1: 0.010, 5: 0.015}, draft={Config("ddtree", 4): 0.005}, context=40)
    # the passes' own phase timings say otherwise (8 ms ar steps, 20 ms tree steps): they must not count
    ar = [Pass(seconds=1.0, tokens=100, accept_lengths=[1] * 100, steps=100,
               timings={"verify_forward": 0.6, "verify_walk": 0.1, "commit": 0.1})]
    tree = [Pass(seconds=0.8, tokens=100, accept_lengths=[3] * 50, steps=50,
                 timings={"draft": 0.3, "tree": 0.1, "verify_forward": 0.5, "pack": 0.05, "commit": 0.05})]
    peers = [{"name": "hf_generate", "tok_s": 50.0}]
    ar_cell, tree_cell = summarize_group({Config("ar"): ar, Config("ddtree", 4): tree}, 0.0, 1, 4, peers, {None: costs})
    assert ar_cell["bound"] == 1.0 and ar_cell["costs_ms"]["tree_size"] == 1
    assert tree_cell["costs_ms"] == pytest.approx({"c1": 10.0, "draft": 5.0, "verify": 15.0, "tree_size": 5,
                                                   "context": 40})
    assert tree_cell["bound"] == pytest.approx(1.5)
    assert tree_cell["speedup_vs_ar"] == pytest.approx(125 / 100)
    assert tree_cell["bound_share"] == pytest.approx(1.25 / 1.5)
    assert tree_cell["phase_ms_per_step"]["draft"] == pytest.approx(6.0)  # in-round, reported beside
    assert tree_cell["speedup_vs_peers"] == {"hf_generate": pytest.approx(125 / 50)}
    assert tree_cell["accept_length_histogram"] == [0, 0, 50, 0]


def test_component_costs_time_each_size_apart_and_leave_the_engine_as_it_was(pair):
    from flashtree import LLM, SamplingParams
    target, draft, _ = pair
    llm = LLM(model=target, draft=draft, method="ddtree", dtype="float32", device="cpu", max_batch_size=2)
    eng = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = llm.generate([[5, 6, 7], [8, 9]], params)
    stats, free = dataclasses.replace(eng.stats), eng.blocks.free_slots
    seen = {"draft": []}
    shapes_before = eng.runner.shapes.copy()
    real_draft = eng.drafts.source
    eng.drafts.source = lambda batch: seen["draft"].append((len(batch), batch[0].method)) or real_draft(batch)
    taus = {Config("ar"): 1.0, Config("dflash"): 3.2, Config("ddtree", 3): 2.6}
    costs = component_costs(llm, taus, concurrency=2, context=20, repeats=2)
    eng.drafts.source = real_draft
    seen["forward"] = [(B, T) for (model, B, T), n in (eng.runner.shapes - shapes_before).items() if model == "target"]
    assert sorted(costs.forward) == [1, 4, 8] and all(t > 0 for t in costs.forward.values())
    assert set(costs.draft) == {Config("dflash"), Config("ddtree", 3)} and all(t > 0 for t in costs.draft.values())
    assert costs.context == 20
    assert {(2, n) for n in (1, 4, 8)} <= set(seen["forward"])  # 2 sequences x each tree size
    assert sorted(set(seen["draft"])) == [(2, "ddtree"), (2, "dflash")]
    assert eng.stats == stats and eng.blocks.free_slots == free and not eng.has_work()
    assert [o.token_ids for o in llm.generate([[5, 6, 7], [8, 9]], params)] == [o.token_ids for o in before]


def test_reports_carry_no_machine_paths(bench, pair, tmp_path, monkeypatch):
    _, out, rep, _ = bench
    m = rep["meta"]
    for key in ("model", "draft", "prompts"):
        assert not Path(m[key]).is_absolute() and m[key].startswith(".../"), m[key]
    for text in ((out / "report.md").read_text(), (out / "bench.json").read_text()):
        for p in pair:
            assert str(p) not in text and str(p.parent) not in text
        assert str(out) not in text
    assert "load_1m" in m["load"]["before"] and "load average" in (out / "report.md").read_text()
    import flashtree
    pkg = Path(flashtree.__file__).parent
    assert portable_path(pkg / "bundled" / "target") == "flashtree/bundled/target"
    monkeypatch.chdir(tmp_path)
    assert portable_path(tmp_path / "a" / "b.jsonl") == "a/b.jsonl"
    assert portable_path("/srv/alice/models/qwen") == ".../models/qwen"
    from flashtree.commands.bench import portable_command
    assert portable_command(["--model", "/srv/alice/qwen", "--out=/srv/alice/res", "--budgets", "4,8"]) == \
        "flashtree --model .../alice/qwen --out=.../alice/res --budgets 4,8"


@pytest.mark.parametrize("argv, message", [
    (["--methods", "ar,beam"], "unknown method"),
    (["--concurrency", "0"], "concurrency"),
    (["--temperatures", "-1"], "temperatures"),
    (["--topks", "0"], "--topks"),
    (["--budgets", "3,4", "--topks", "1,5"], "topk [5] exceeds every budget"),
    (["--budgets", "0,auto"], "budgets must be integers >= 1 or 'auto'"),
    (["--exact-samples", "50"], "--exact-samples"),
    (["--slice-prompts", "0"], "--slice-prompts must be >= 1"),
])
def test_bench_rejects_bad_arguments(pair, argv, message, capsys):
    target, draft, prompts = pair
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--prompts", str(prompts), *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_budgets_take_integers_and_auto(pair, capsys):
    from flashtree.commands.bench import parse_budgets
    assert parse_budgets("4, 8,AUTO") == [4, 8, "auto"]
    with pytest.raises(SystemExit):
        main(["bench", "--budgets", "3,big"])
    assert "integers and/or 'auto', got '3,big'" in capsys.readouterr().err


def test_bench_speculative_methods_need_a_drafter(pair, capsys):
    target, _, prompts = pair
    assert main(["bench", "--model", str(target), "--prompts", str(prompts)]) == 2
    assert "--draft" in capsys.readouterr().err
    # a model named with its own drafter needs no --draft
    import argparse

    from flashtree.commands.bench import add_arguments, plan_from_args
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert plan_from_args(p.parse_args(["--model", "tiny-code", "--methods", "ar,dflash"])).methods == ["ar", "dflash"]


def test_tree_size_of_a_capped_tree():
    from flashtree.measure.bench import tree_size
    assert tree_size(Config("ddtree", 16), 8) == 17
    assert tree_size(Config("ddtree", 16, 1), 8) == 8      # a chain: one node per depth
    assert tree_size(Config("ddtree", 7, 1), 8) == 8
    assert tree_size(Config("ddtree", "auto"), 8) is None  # its size changes every round
    assert tree_size(Config("ddtree", 16, 2), 8) == 17     # 2 + 4 + ... > 16
    assert tree_size(Config("ddtree", 16, 2), 3) == 7      # 2 + 4
    assert Config("ddtree", 7, 1).label == "ddtree@7/topk1" and Config("ddtree", 7).label == "ddtree@7"


def _wrong_bonus(batch, vin, logits, draw):
    """A broken verifier: whenever a draft was verified, the bonus repeats the root token."""
    import numpy as np

    from flashtree.engine.round import verify_round
    out = verify_round(batch, vin, logits, draw)
    out.bonus = np.where(vin.valid[:, 1:].any(1), vin.tokens[:, 0], out.bonus)
    return out


def test_the_seeds_sweep_is_one_command_and_one_table(pair, tmp_path, capsys):
    """`--temperatures 0,0.6 --top-p 0.95` with capped trees: per temperature tok/s, tau and exact; a
    broken verifier turns every speculative cell's exact to NO and the exit code to 1."""
    target, draft, prompts = pair
    argv = ["bench", "--model", str(target), "--draft", str(draft), "--prompts", str(prompts), "--num-prompts", "2",
            "--max-tokens", "6", "--methods", "ar,ddtree", "--budgets", "3", "--topks", "none,1",
            "--temperatures", "0,0.6", "--top-p", "0.95", "--repeats", "1", "--warmup", "0", "--no-peers",
            "--exact-samples", "2000"]
    assert main(argv + ["--out", str(tmp_path / "good")]) == 0
    table = capsys.readouterr().out
    rep = json.loads((tmp_path / "good" / "bench.json").read_text())
    assert rep["meta"]["topks"] == [None, 1] and rep["meta"]["top_p"] == 0.95
    assert [(c["temperature"], c["label"]) for c in rep["cells"]] == \
        [(t, lab) for t in (0, 0.6) for lab in ("ar", "ddtree@3", "ddtree@3/topk1")]
    for c in rep["cells"]:
        assert c["exact"]["passed"] is True
        if c["method"] != "ar":
            assert c["exact"]["check"] == ("greedy identity" if c["temperature"] == 0 else "chi-square cell")
        row = next(line for line in table.splitlines() if line.split()[:3] == [f"{c['temperature']:g}", "1", c["label"]])
        assert f"{c['tok_s']:.1f}" in row and f"{c['mean_accept_length']:.2f}" in row
    assert "exact: at T=0 greedy identity" in (tmp_path / "good" / "report.md").read_text()

    parser, commands = build_parser()  # the command with the engine's verifier seam set on every engine
    wrong = lambda engine: setattr(engine, "verifier", _wrong_bonus)
    assert commands["bench"].run(parser.parse_args(argv + ["--out", str(tmp_path / "bad")]), patch=wrong) == 1
    out, err = capsys.readouterr()
    rep = json.loads((tmp_path / "bad" / "bench.json").read_text())
    for c in rep["cells"]:
        assert c["exact"]["passed"] is (True if c["method"] == "ar" else False), c
    assert "NOT EXACT" in err and "ddtree@3/topk1 at T=0.6" in err
    assert " NO p=" in out and " NO " in out


def test_compile_modes_measure_each_config_in_each_mode_against_its_own_plain_decoding():
    plan = BenchPlan(methods=["ar", "ddtree"], budgets=[4], temperatures=[0.0], concurrency=[1],
                     compile_modes=[False, True])
    cfgs = plan.configs()
    assert [c.label for c in cfgs] == ["ar [eager]", "ddtree@4 [eager]", "ar [compiled]", "ddtree@4 [compiled]"]
    assert cfgs[3].baseline == cfgs[2] and cfgs[1].baseline == cfgs[0]
    assert BenchPlan(methods=["ar"], budgets=[], temperatures=[0.0], concurrency=[1]).configs()[0].label == "ar"


def test_each_repeat_starts_one_configuration_later():
    """Every configuration runs once a repeat, and across as many repeats as there are
    configurations each one runs in every position once (none always first, none always after
    the same one)."""
    cfgs = [Config("ar"), Config("dflash"), Config("ddtree", 8), Config("ddtree", "auto")]
    orders = [pass_order(cfgs, r) for r in range(len(cfgs))]
    assert all(sorted(o, key=cfgs.index) == cfgs for o in orders)
    assert all({o[i] for o in orders} == set(cfgs) for i in range(len(cfgs)))
    assert len({(o[i - 1], o[i]) for o in orders for i in range(1, len(cfgs))}) > len(cfgs) - 1
    assert pass_order(cfgs, 0) == cfgs and pass_order([], 3) == []


def test_slices_cover_the_prompts_in_order_and_fill_the_batch():
    """Consecutive slices of max(size, concurrency) prompts; a short tail that cannot fill a batch
    joins the slice before (a slice narrower than the concurrency would measure a smaller batch)."""
    assert slices(32, 1, 8) == [range(0, 8), range(8, 16), range(16, 24), range(24, 32)]
    assert slices(32, 8, 4) == [range(0, 8), range(8, 16), range(16, 24), range(24, 32)]
    assert slices(10, 1, 4) == [range(0, 4), range(4, 8), range(8, 10)]  # a tail of 2 fills a batch of 1
    assert slices(10, 4, 4) == [range(0, 4), range(4, 10)]              # a tail of 2 cannot fill a batch of 4
    assert slices(3, 8, 8) == [range(0, 3)] and slices(5, 1, 8) == [range(0, 5)]
    for n, c, k in [(32, 1, 8), (33, 8, 8), (7, 2, 3), (1, 1, 1)]:
        assert [i for r in slices(n, c, k) for i in r] == list(range(n))


def test_a_pass_is_its_slices_joined():
    a = Pass(seconds=1.0, tokens=10, accept_lengths=[1, 2], steps=4, timings={"draft": 0.1, "verify": 0.5},
             token_ids=[[1, 2]], budgets=[0, 3], predicted_taus=[1.0, 2.5])
    b = Pass(seconds=3.0, tokens=30, accept_lengths=[3], steps=6, timings={"verify": 1.5, "commit": 0.2},
             token_ids=[[3], [4]], budgets=[5], predicted_taus=[3.0])
    j = Pass.joined([a, b])
    assert (j.seconds, j.tokens, j.steps, j.tok_s) == (4.0, 40, 10, 10.0)
    assert j.timings == pytest.approx({"draft": 0.1, "verify": 2.0, "commit": 0.2})
    assert j.accept_lengths == [1, 2, 3] and j.token_ids == [[1, 2], [3], [4]]
    assert j.budgets == [0, 3, 5] and j.predicted_taus == [1.0, 2.5, 3.0]


def test_the_pooled_interval_tells_a_one_percent_cost_from_the_machines_drift():
    """Slices whose speed drifts by up to 30 % (both configurations alike, as back-to-back slices
    do) with 0.5 % noise of their own: a configuration 1 % slower is told apart (the interval lies
    below 1), an equal one is not (it covers 1) — the check the bench's `pooled [95%]` column makes."""
    import numpy as np

    from flashtree.measure.bench import Pass, pooled_ratio
    rng = np.random.default_rng(3)

    def passes(speeds, cost):  # 5 repeats of 16 slices, 128 tokens each
        return [Pass.joined([Pass(seconds=128 / (v * (1 - cost)) * (1 + 0.005 * rng.standard_normal()), tokens=128)
                             for v in rep]) for rep in speeds]
    speeds = 800 * (1 + 0.3 * rng.random((5, 16)))
    base = passes(speeds, 0.0)
    r, lo, hi = pooled_ratio(passes(speeds, 0.01), base)
    assert hi < 1.0 and r == pytest.approx(0.99, abs=0.004)
    r, lo, hi = pooled_ratio(passes(speeds, 0.0), base)
    assert lo < 1.0 < hi and hi - lo < 0.01
    assert pooled_ratio([Pass(1.0, 10)], [Pass(1.0, 10)]) is None  # no slices: no interval


def test_prompt_files_hold_text_or_chats(tmp_path):
    from flashtree.train.chats import HELDOUT_CHATS
    from flashtree.train.corpus import load_prompts
    chats = load_prompts(HELDOUT_CHATS)       # what `bench --prompts chats` reads
    assert len(chats) >= 16 and all(isinstance(c, list) and c[0]["role"] == "user" for c in chats)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "def f():"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert load_prompts(f) == ["def f():", [{"role": "user", "content": "hi"}]]
    f.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="no 'prompt' field and no 'messages' list"):
        load_prompts(f)
