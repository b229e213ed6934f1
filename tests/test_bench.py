"""`flashtree bench` on a tiny random pair: the report's numbers must agree with each other."""
from __future__ import annotations

import contextlib
import io
import json
import statistics

import pytest

from flashtree.benchmarking import Config, Pass, summarize_group
from flashtree.cli import main

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
            "--num-prompts", "2", "--max-tokens", "6", "--methods", "ar,dflash,ddtree", "--budgets", "3",
            "--temperatures", "0,1", "--concurrency", "1,2", "--repeats", "2", "--warmup", "0", "--out", str(out)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    return rc, out, json.loads((out / "bench.json").read_text()), buf.getvalue()


def test_bench_writes_consistent_report(bench):
    rc, out, rep, stdout = bench
    assert rc == 0
    meta, cells, peers = rep["meta"], rep["cells"], rep["peers"]
    assert meta["num_prompts"] == 2 and meta["max_tokens"] == 6 and meta["repeats"] == 2
    assert meta["versions"]["torch"]
    assert len(cells) == 2 * 2 * 3 and len(peers) == 2 * 2
    assert {c["label"] for c in cells} == {"ar", "dflash", "ddtree@3"}
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
        assert c["bound_share"] == pytest.approx(c["speedup_vs_ar"] / c["bound"])
        if c["method"] == "ar":
            assert h[0] == c["rounds"] and c["bound"] == 1.0 and c["speedup_vs_ar"] == pytest.approx(1.0)
        else:
            k = c["costs_ms"]
            assert k["draft"] > 0 and k["verify"] > 0
            assert c["bound"] == pytest.approx(c["mean_accept_length"] * k["c1"] / (k["draft"] + k["verify"]))
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


def test_bench_writes_pngs_and_markdown(bench):
    import matplotlib.image as mpimg
    _, out, _, _ = bench
    for name in ("speedup_vs_budget", "tau_histogram", "toks_vs_concurrency"):
        path = out / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC
        img = mpimg.imread(path)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0.01  # not blank
        assert f"({name}.png)" in (out / "report.md").read_text()


def test_bound_from_component_costs():
    # ar: 10 ms per step; ddtree: tau 3 at 5 ms draft + 15 ms verify -> bound 3 * 10 / 20 = 1.5
    ar = [Pass(seconds=1.0, tokens=100, accept_lengths=[1] * 100, steps=100,
               timings={"verify_forward": 0.8, "verify_walk": 0.1, "commit": 0.1})]
    tree = [Pass(seconds=0.8, tokens=100, accept_lengths=[3] * 50, steps=50,
                 timings={"draft": 0.2, "tree": 0.05, "verify_forward": 0.6, "pack": 0.05, "commit": 0.1})]
    peers = [{"name": "hf_generate", "tok_s": 50.0}]
    ar_cell, tree_cell = summarize_group({Config("ar"): ar, Config("ddtree", 4): tree}, 0.0, 1, 4, peers)
    assert ar_cell["costs_ms"]["c1"] == pytest.approx(10.0)
    assert tree_cell["costs_ms"]["draft"] == pytest.approx(5.0)
    assert tree_cell["costs_ms"]["verify"] == pytest.approx(15.0)
    assert tree_cell["bound"] == pytest.approx(1.5)
    assert tree_cell["speedup_vs_ar"] == pytest.approx(125 / 100)
    assert tree_cell["bound_share"] == pytest.approx(1.25 / 1.5)
    assert tree_cell["speedup_vs_peers"] == {"hf_generate": pytest.approx(125 / 50)}
    assert tree_cell["accept_length_histogram"] == [0, 0, 50, 0]


@pytest.mark.parametrize("argv, message", [
    (["--methods", "ar,beam"], "unknown method"),
    (["--concurrency", "0"], "concurrency"),
    (["--temperatures", "-1"], "temperatures"),
])
def test_bench_rejects_bad_arguments(pair, argv, message, capsys):
    target, draft, prompts = pair
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--prompts", str(prompts), *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_speculative_methods_need_a_drafter(pair, capsys):
    target, _, prompts = pair
    assert main(["bench", "--model", str(target), "--prompts", str(prompts)]) == 2
    assert "--draft" in capsys.readouterr().err
