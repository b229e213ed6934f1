"""AOTInductor packages of the runner's forwards (engine/aot_graphs.py): buckets, the disk cache, weights."""
import pytest
import torch

from flashtree.engine import aot_graphs
from flashtree.engine.aot_graphs import AOTGraphs

pytestmark = pytest.mark.skipif(not aot_graphs.available(), reason=aot_graphs.why_unavailable() or "")


class Tiny(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = torch.nn.Linear(8, 8, dtype=torch.float64)

    def step(self, x, scale):
        # x [B, T, 8]; scale [S]: a reduction over a second dynamic size
        return self.proj(x) * scale.sum(), x.shape[1] * torch.ones(1, dtype=torch.float64)


def graphs(model, **settings):
    return AOTGraphs("tiny", model.step, {"model": model}, (("B", "T", None), ("S",)), settings)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTREE_CACHE_DIR", str(tmp_path))
    return tmp_path / "aoti"


def test_a_bucket_is_compiled_once_then_loaded_from_the_cache(cache):
    model = Tiny()
    g = graphs(model)
    x, s = torch.randn(3, 5, 8, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    with torch.inference_mode():
        out, t = g(x, s)
        torch.testing.assert_close(out, model.step(x, s)[0], rtol=0, atol=1e-12)
        assert t.item() == 5
        # the same bucket at other dynamic sizes: no new package
        x2, s2 = torch.randn(2, 9, 8, dtype=torch.float64), torch.rand(7, dtype=torch.float64)
        torch.testing.assert_close(g(x2, s2)[0], model.step(x2, s2)[0], rtol=0, atol=1e-12)
        assert g(x2, s2)[1].item() == 9  # T is an input of the graph, not a constant
        assert g.compiled_now == 1 and len(list(cache.glob("*.pt2"))) == 1
        # a size of 1 is its own bucket
        x1 = torch.randn(1, 1, 8, dtype=torch.float64)
        torch.testing.assert_close(g(x1, s)[0], model.step(x1, s)[0], rtol=0, atol=1e-12)
        assert g.compiled_now == 2 and len(g.packages) == 2
        # a new object for the same model and settings (a new engine, a new process) loads both
        again = graphs(model)
        torch.testing.assert_close(again(x, s)[0], out, rtol=0, atol=0)
        again(x1, s)
        assert again.compiled_now == 0


def test_packages_use_the_models_own_weights(cache):
    """Weights are not copied into the package: the loaded graph reads the module's tensors."""
    model = Tiny()
    g = graphs(model)
    x, s = torch.randn(2, 3, 8, dtype=torch.float64), torch.rand(2, dtype=torch.float64)
    with torch.inference_mode():
        before = g(x, s)[0]
        model.proj.bias.add_(1.0)
        after = g(x, s)[0]
    torch.testing.assert_close(after - before, s.sum().expand_as(before), rtol=0, atol=1e-12)


def test_a_cached_package_serves_another_model_of_the_same_shapes_with_its_own_weights(cache):
    """The key holds weight shapes, not values: nothing of the exporting model's weights may stay in
    the package (inductor would inline a bias of <= 8 values into the code unless told not to)."""
    a, b = Tiny(seed=1), Tiny(seed=2)
    x, s = torch.randn(2, 3, 8, dtype=torch.float64), torch.rand(2, dtype=torch.float64)
    with torch.inference_mode():
        ga, gb = graphs(a), graphs(b)
        out_a = ga(x, s)[0]
        out_b = gb(x, s)[0]
    assert ga.compiled_now == 1 and gb.compiled_now == 0  # b loaded a's package
    torch.testing.assert_close(out_a, a.step(x, s)[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(out_b, b.step(x, s)[0], rtol=0, atol=1e-12)
    assert (out_a - out_b).abs().max() > 0.1


def test_the_key_names_what_the_graph_depends_on(cache):
    model = Tiny()
    a, b = graphs(model, page_size=16), graphs(model, page_size=8)
    bucket = frozenset()
    assert a.path(bucket) != b.path(bucket)                       # settings
    assert a.path(bucket) != a.path(frozenset({("B", 1)}))        # buckets
    assert a.path(bucket) == graphs(model, page_size=16).path(bucket)
    other = Tiny()
    other.proj = torch.nn.Linear(8, 16, dtype=torch.float64)
    assert graphs(other, page_size=16).path(bucket) != a.path(bucket)  # weight shapes


def test_precompile_single_builds_what_one_sequence_runs_and_batches_compile_on_first_use(tiny_pair, caplog):
    """LLM(precompile="single") compiles the three graphs of one sequence (target 1 x 1, 1 x >1,
    drafter 1 x >1) before it returns; the first batch compiles its own graphs and decodes exactly
    (every method's greedy output equals plain decoding's through them)."""
    import logging

    from flashtree import LLM, SamplingParams
    from flashtree.errors import UserError
    from helpers import repetitive_prompts
    with pytest.raises(UserError, match="precompile must be one of 'single', 'all', 'background', got 'some'"):
        LLM(*tiny_pair, precompile="some")
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        llm = LLM(*tiny_pair, method="dflash", compile=True, precompile="single", max_batch_size=4)
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled ")]
    assert len(compiled) == 1 and compiled[0].startswith(
        "compiled 3 graphs (target batch 1 x 1, target batch 1 x >1, drafter batch 1 x >1)")
    def built():  # (model, its bucket's static sizes) of every package the runner holds
        return sorted((model, sorted(sizes.items())) for model, sizes in llm.engine.runner.built_graphs())
    one_sequence = built()
    assert one_sequence == [("drafter", [("B", 1)]), ("target", [("B", 1)]), ("target", [("B", 1), ("R", 1), ("T", 1)])]
    prompts, params = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    # one auto request: its cost seeding times batch 1 alone, so no batch graph is built for it
    llm.generate(prompts[:1], params, method="ddtree", budget="auto")
    assert built() == one_sequence
    ar = [o.token_ids for o in llm.generate(prompts, params, method="ar")]
    assert any(("B", 1) not in sizes for _, sizes in built())  # the batch built its own
    for method in ("dflash", "ddtree"):
        outs = llm.generate(prompts, params, method=method)
        assert [o.token_ids for o in outs] == ar, method
    assert ("target", []) in built()  # batched verifies (B>1 x T>1) ran through a graph compiled on first use


def test_precompile_all_compiles_half_of_the_graphs_in_a_helper_process(tiny_pair, cache, caplog):
    """LLM(precompile="all") on an empty cache: this process compiles its share of the six graphs
    (compile_helper.split) while a helper process compiles the other three into the same cache,
    under the same keys, so this process loads them (compiles none of them) and holds all six;
    output through them equals plain decoding's. On a warm cache no helper starts."""
    import logging

    from flashtree import LLM, SamplingParams
    from flashtree.engine import compile_helper
    from helpers import repetitive_prompts
    if compile_helper.cores() < 2:
        pytest.skip("one core: the load compiles every graph itself")
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        llm = LLM(*tiny_pair, method="dflash", compile=True, precompile="all", max_batch_size=4)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("compiling 3 graphs in a helper process") for m in messages), messages
    assert any(m.startswith("compiled 6 graphs") and m.endswith("(3 in a helper process)") for m in messages)
    compiled_here = sorted(m for m in messages if m.startswith("compiling the "))  # (the helper logs to itself)
    assert compiled_here == [  # split's share: the one-token graphs of both batch sizes, the one-sequence drafter
        "compiling the drafter graph for B=1 with AOTInductor",
        "compiling the target graph for B=1, R=1, T=1 with AOTInductor",
        "compiling the target graph for T=1 with AOTInductor"], compiled_here
    assert len(llm.engine.runner.built_graphs()) == 6 and len(list(cache.glob("*.pt2"))) == 6
    prompts, params = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ar = [o.token_ids for o in llm.generate(prompts, params, method="ar")]
    assert [o.token_ids for o in llm.generate(prompts, params, method="dflash")] == ar
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        again = LLM(*tiny_pair, method="dflash", compile=True, precompile="all", max_batch_size=4)
    assert not any("helper" in r.getMessage() for r in caplog.records)
    assert len(again.engine.runner.built_graphs()) == 6


class Held:
    """A background helper that has not finished until told (the seam Engine.warmup starts)."""

    def __init__(self):
        self.buckets, self.finished, self.stopped = None, False, False

    def start(self, buckets):
        self.buckets = buckets
        return self

    def done(self):
        return self.finished

    def stop(self):
        self.stopped = self.finished = True


def test_deferred_batch_graphs_run_eager_and_a_close_stops_their_helper(tiny_pair, cache, caplog):
    """Engine.warmup(background=...): the batch graphs not on disk go to the helper it starts;
    until the helper is done, batches run eager (no batch package built or compiled here, output
    of every method equal to plain decoding's), one sequence through its graphs; closing the LLM
    stops the helper and ends the deferral."""
    import logging

    from flashtree import LLM, SamplingParams
    from helpers import repetitive_prompts
    llm = LLM(*tiny_pair, method="dflash", compile=True, precompile="single", max_batch_size=4)
    runner, held = llm.engine.runner, Held()
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        llm.engine.warmup(batched=False, background=held.start)
    assert sorted(b[:2] for b in held.buckets) == [("drafter", 3), ("target", 3), ("target", 3)]
    assert runner.deferred is held and "batches run eager until the helper has compiled their 3 graphs" in caplog.text
    assert runner.compiling()  # (what a server's /health reports as graphs_compiling)
    one_sequence = sorted(runner.built_graphs(), key=str)
    prompts, params = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        ar = [o.token_ids for o in llm.generate(prompts, params, method="ar")]
        for method in ("dflash", "ddtree"):
            assert [o.token_ids for o in llm.generate(prompts, params, method=method)] == ar, method
    assert "compiling the" not in caplog.text and sorted(runner.built_graphs(), key=str) == one_sequence
    assert runner.shapes["target", 3, 1] and runner.shapes["drafter", 3, 8]  # batches ran, eager
    llm.close()
    assert held.stopped and runner.deferred is None and not runner.compiling()


def test_precompile_background_loads_the_helpers_graphs_once_written(tiny_pair, cache, caplog):
    """LLM(precompile="background") on an empty cache returns after the one-sequence graphs, a
    helper compiling the batch graphs at a lower priority; batches decode eager meanwhile, and once
    the helper has written the packages the next batch loads them (compiles none here): six graphs,
    output through them equal to plain decoding's. On a warm cache no helper starts."""
    import logging

    from flashtree import LLM, SamplingParams
    from flashtree.engine import compile_helper
    from helpers import repetitive_prompts
    if compile_helper.cores() < 2:
        pytest.skip("one core: the load compiles every graph itself")
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        llm = LLM(*tiny_pair, method="dflash", compile=True, precompile="background", max_batch_size=4)
    runner = llm.engine.runner
    assert "batches run eager until the helper has compiled their 3 graphs" in caplog.text
    assert runner.deferred is not None and len(runner.built_graphs()) == 3
    prompts, params = repetitive_prompts(3), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = [o.token_ids for o in llm.generate(prompts, params, method="dflash")]
    assert runner.deferred.process.wait(timeout=600) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        ar = [o.token_ids for o in llm.generate(prompts, params, method="ar")]
        assert [o.token_ids for o in llm.generate(prompts, params, method="dflash")] == ar
    assert "compiling the" not in caplog.text and runner.deferred is None
    assert len(runner.built_graphs()) == 6 and len(list(cache.glob("*.pt2"))) == 6
    assert [len(t) for t in eager] == [12] * 3  # (decoded eager, or partly through packages as they landed)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flashtree.engine"):
        again = LLM(*tiny_pair, method="dflash", compile=True, precompile="background", max_batch_size=4)
    assert not any("helper" in r.getMessage() for r in caplog.records) and again.engine.runner.deferred is None
    assert len(again.engine.runner.built_graphs()) == 6


def test_the_helper_never_runs_the_users_script_again(tiny_pair, cache, tmp_path):
    """A user's script with no `if __name__ == "__main__":` guard, loading with the default
    precompile ("single"): a helper compiles one of its two graphs, and the script's body runs once
    (a multiprocessing spawn would import the script again in the helper and run it there too).
    Neither process prints a warning: no runpy warning about the helper's module, none of torch's
    about its own deprecated LeafSpec, which export constructs."""
    import os
    import subprocess
    import sys

    from flashtree.engine import compile_helper
    if compile_helper.cores() < 2:
        pytest.skip("one core: no helper starts")
    script = tmp_path / "user_script.py"
    script.write_text(
        "import logging\n"
        "from flashtree import LLM\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "print('the script body runs', flush=True)\n"
        f"llm = LLM({str(tiny_pair[0])!r}, method='ar', compile=True)\n"
        "print('graphs', len(llm.engine.runner.built_graphs()), flush=True)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                         env=os.environ | {"FLASHTREE_CACHE_DIR": str(cache.parent)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("the script body runs") == 1, run.stdout
    assert "graphs 2" in run.stdout
    assert "compiling 1 graphs in a helper process" in run.stderr
    assert "compiled 2 graphs" in run.stderr and "(1 in a helper process)" in run.stderr
    assert run.stderr.count("compiling the target graph") == 1  # the other one is the helper's
    assert "Warning" not in run.stderr, run.stderr[-3000:]


def test_a_stopped_helper_ends_at_once(tiny_pair, cache):
    """Helper.stop (the loader's warmup failed or was interrupted) kills the helper mid-compile:
    it does not run on, compiling for a load that no longer exists."""
    import time

    from flashtree.engine import compile_helper
    from flashtree.engine.engine_config import EngineConfig
    rebuild = compile_helper.Rebuild(str(tiny_pair[0]), None, "float32", EngineConfig(method="ar"), 1)
    helper = compile_helper.Helper(rebuild, [("target", 1, 1), ("target", 1, 9)])
    time.sleep(1)
    t0 = time.perf_counter()
    helper.stop()
    assert time.perf_counter() - t0 < 5
    assert helper.process.returncode is not None and helper.process.returncode < 0  # killed, not finished
    assert not list(cache.glob("*.pt2"))


def test_the_helper_gets_the_graphs_that_balance_the_two_processes():
    """split: longest first, each to whichever process has less work, the loader taking the first
    graph and ties (the helper starts later); a target graph weighs three drafter graphs."""
    from flashtree.engine.compile_helper import split
    one = [("target", 1, 1), ("target", 1, 17), ("drafter", 1, 8)]  # precompile="single"
    assert split(one) == ([("target", 1, 1), ("drafter", 1, 8)], [("target", 1, 17)])
    every = [("target", 1, 1), ("target", 1, 17), ("target", 3, 1), ("target", 3, 17), ("drafter", 1, 8),
             ("drafter", 3, 8)]
    mine, theirs = split(every)
    assert mine == [("target", 1, 1), ("target", 3, 1), ("drafter", 1, 8)]
    assert theirs == [("target", 1, 17), ("target", 3, 17), ("drafter", 3, 8)]
    assert split([("target", 1, 1)]) == ([("target", 1, 1)], [])  # nothing to hand over: no helper
    assert split([]) == ([], [])
    assert split([("drafter", 1, 8), ("drafter", 3, 8), ("target", 1, 1)]) == (
        [("target", 1, 1)], [("drafter", 1, 8), ("drafter", 3, 8)])


def test_no_compile_helper_with_the_switch_off_or_on_one_core(monkeypatch):
    from flashtree.engine import compile_helper
    from flashtree.engine.engine_config import EngineConfig
    rebuild = compile_helper.Rebuild("target", None, "float32", EngineConfig(method="ar"), 1)
    monkeypatch.setenv("FLASHTREE_COMPILE_HELPER", "off")
    assert compile_helper.start(rebuild) is None
    monkeypatch.delenv("FLASHTREE_COMPILE_HELPER")
    assert (compile_helper.start(rebuild) is None) == (compile_helper.cores() < 2)
