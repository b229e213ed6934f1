"""`flashtree env`: the report's keys, the pair's config and why methods are unavailable."""
from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from flashtree.cli import main
from flashtree.commands import env
from flashtree.speculative.proposer import METHODS
from helpers import make_drafter


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair  # tests/conftest.py: random qwen3 target (V=96, 3 layers) + DFlash drafter (block 8)


def env_json(capsys, *argv) -> dict:
    assert main(["env", "--json", *map(str, argv)]) == 0
    return json.loads(capsys.readouterr().out)


def test_env_reports_installation_and_pair(pair, capsys):
    target, draft = pair
    r = env_json(capsys, "--model", target, "--draft", draft)
    assert set(r) >= {"versions", "platform", "device", "compiled", "pair", "methods", "sampling"}
    v = r["versions"]
    assert v["python"] and v["torch"] and v["tokenizers"] and v["safetensors"] and "transformers" in v
    assert r["device"]["selected"] in ("cpu", "cuda") and isinstance(r["device"]["cuda_available"], bool)
    assert r["device"]["dtypes"]["float32"] == {"supported": True, "fast": True, "note": r["device"]["dtypes"]["float32"]["note"]}
    assert set(r["device"]["dtypes"]) == {"float32", "bfloat16", "float16"}
    # dtype auto's activations: float32 where quant auto keeps blocks, else the dtype's own
    if r["switches"].get("FLASHTREE_DTYPE") in (None, "", "auto"):
        assert r["activations"] == ("float32" if r["quant"] else r["dtype"])
    c = r["compiled"]
    assert c["attention"]["runs"]["math"] is True and c["attention"]["head_dim"] == 16  # the target's
    assert c["attention"]["kernel"] is None or c["attention"]["runs"][c["attention"]["kernel"]]
    assert c["torch_compile"]["probed"] is False and c["torch_compile"]["works"] is None
    if r["device"]["selected"] == "cpu":
        assert c["cuda_graphs"]["works"] is False
        from flashtree.models import (
            cpu_dense,  # the report says what the runner will do, and why
        )
        assert c["cpu_kernel"]["used"] is cpu_dense.available()
        assert c["cpu_kernel"]["why"] == (cpu_dense.why_unavailable() or c["cpu_kernel"]["why"])
    assert all(m["available"] for m in r["methods"].values()) and list(r["methods"]) == list(METHODS)
    assert r["sampling"]["top_p"]["available"] and r["sampling"]["greedy"]["available"]
    t, d = r["pair"]["target"], r["pair"]["drafter"]
    assert r["pair"]["bundled"] is False and t["error"] is None and d["error"] is None
    assert (t["model_type"], t["vocab_size"], t["num_hidden_layers"], t["hidden_size"]) == ("qwen3", 96, 3, 64)
    with safe_open(str(target / "model.safetensors"), framework="pt") as f:
        assert t["params"] == sum(f.get_tensor(k).numel() for k in f.keys())
    assert (d["block_size"], d["target_layer_ids"], d["num_hidden_layers"]) == (8, [0, 2], 1)
    assert d["params"] > 0


def test_env_without_drafter_says_why(pair, capsys):
    target, _ = pair
    r = env_json(capsys, "--model", target)
    assert r["methods"]["ar"]["available"] and r["methods"]["ngram"]["available"]  # no drafter needed
    for m in ("dflash", "ddtree"):
        assert not r["methods"][m]["available"] and "--draft" in r["methods"][m]["why"]
    assert r["pair"]["drafter"] is None


def test_env_mismatched_drafter_names_the_field(pair, capsys, tmp_path):
    target, _ = pair
    bad = tmp_path / "bad"
    bad.mkdir()
    make_drafter(bad, target, target_layer_ids=(0, 7))
    r = env_json(capsys, "--model", target, "--draft", bad)
    assert r["methods"]["ar"]["available"] and not r["methods"]["ddtree"]["available"]
    assert "target_layer_ids" in r["methods"]["ddtree"]["why"]


def test_env_missing_model(capsys, tmp_path):
    r = env_json(capsys, "--model", tmp_path / "nope")
    assert not any(m["available"] for m in r["methods"].values())
    assert "nope" in r["pair"]["target"]["error"] and "not found" in r["methods"]["ar"]["why"]


def test_env_default_pair_and_text(pair, capsys):
    from flashtree.models.registry import resolve
    r = env_json(capsys)  # the default pair (the registry's), present or not: either way a report, exit 0
    assert r["pair"]["target"]["path"] == str(resolve(None).target)
    if r["pair"]["target"]["error"]:
        assert "train-target" in r["methods"]["ar"]["why"]
    target, draft = pair
    assert main(["env", "--model", str(target), "--draft", str(draft)]) == 0
    text = capsys.readouterr().out
    for needle in ("versions", "torch", "device", "compiled paths", "compile='auto') runs eager PyTorch", "methods",
                   "ddtree             available", "block_size", "target_layer_ids   [0, 2]"):
        assert needle in text, needle


def test_env_reports_the_attention_kernel_sdpa_picks(pair, capsys):
    import inspect

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtree import LLM
    c = env_json(capsys, "--model", pair[0], "--device", "cpu")["compiled"]
    assert c["engine"]["compile_option"] == ("compile" in inspect.signature(LLM).parameters)
    with sdpa_kernel([SDPBackend.MATH]):  # the probe sees what the engine would get
        forced = env_json(capsys, "--model", pair[0], "--device", "cpu")["compiled"]["attention"]
    assert forced["kernel"] in ("math", None) and forced["runs"] == c["attention"]["runs"]
    if c["attention"]["kernel"] is not None:
        assert forced["kernel"] == "math"


@pytest.mark.parametrize("code, works, why", [
    ("import sys; sys.exit('inductor is broken here')", False, "inductor is broken here"),
    ("print('{\"works\": false, \"seconds\": 0.1}')", False, "differs from eager"),
    ("print('{\"works\": true, \"seconds\": 0.1}')", True, "matched eager"),
    ("import time; time.sleep(60)", None, "timed out after 1 s"),
])
def test_env_compile_probe_runs_contained(code, works, why, monkeypatch, capsys):
    monkeypatch.setattr(env, "COMPILE_PROBE", code)
    t = env_json(capsys, "--device", "cpu", "--probe-compile", "--probe-timeout", 1)["compiled"]["torch_compile"]
    assert t["probed"] is True and t["works"] is works and why in t["why"]


@pytest.mark.slow
def test_env_torch_compile_really_compiles(capsys):
    t = env_json(capsys, "--device", "cpu", "--probe-compile")["compiled"]["torch_compile"]
    assert t["works"] is True and t["seconds"] > 0, t


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_env_captures_a_cuda_graph(capsys):
    c = env_json(capsys, "--device", "cuda")["compiled"]
    assert c["cuda_graphs"]["works"] is True, c["cuda_graphs"]
    assert c["attention"]["dtype"] in ("bfloat16", "float16")


@pytest.mark.parametrize("argv, kw", [((), {}), (("--kv-cache-tokens", 5000, "--page-size", 8),
                                                  dict(kv_cache_tokens=5000, page_size=8))])
def test_env_kv_capacity_is_what_llm_allocates(pair, capsys, argv, kw):
    from flashtree import LLM
    target, draft = pair
    kv = env_json(capsys, "--model", target, "--draft", draft, *argv)["kv_cache"]
    llm = LLM(model=target, draft=draft, compile=False, **kw)
    blocks, runner = llm.engine.blocks, llm.engine.runner
    assert kv["error"] is None and kv["kv_cache_tokens"] == blocks.capacity_tokens
    assert (kv["page_size"], kv["pages"]) == (blocks.page_size, blocks.pages_total)
    assert kv["mib"] == round((runner.cache.nbytes + runner.draft_cache.nbytes + runner.features.nbytes) / 2**20, 1)


def test_env_says_when_the_kv_cache_cannot_hold_one_sequence(pair, capsys):
    target, draft = pair
    kv = env_json(capsys, "--model", target, "--draft", draft, "--kv-cache-tokens", 100)["kv_cache"]
    assert "kv_cache_tokens=100 cannot hold one sequence" in kv["error"]


def test_bf16_projections_take_amx_tiles_on_the_amx_path_only(monkeypatch):
    """The bf16 kernel's path as `env` reports it: AMX tiles on the amx path (a verify of many rows
    then streams the weights once), vdpbf16ps on avx512_bf16, none below (test_cpu_paths.py runs
    each path the CPU has for real)."""
    from flashtree import cpu
    from flashtree.models import cpu_dense
    monkeypatch.setattr(cpu, "isa", lambda: "amx")
    assert cpu_dense.bf16_path().startswith("AMX tiles")
    monkeypatch.setattr(cpu, "isa", lambda: "avx512_bf16")
    assert cpu_dense.bf16_path() == "vdpbf16ps dot products"
    for lower in ("avx512", "avx2", cpu.NONE):
        monkeypatch.setattr(cpu, "isa", lambda lower=lower: lower)
        assert cpu_dense.bf16_path() is None


def test_env_lists_every_switch_and_hides_the_api_key(pair, capsys, monkeypatch):
    """`flashtree env` names each FLASHTREE_* switch with its value and meaning; a secret shows only
    that it is set. An off switch is off for every spelling of off, and an unknown name is refused."""
    from flashtree import switches
    monkeypatch.setenv("FLASHTREE_API_KEY", "sk-very-secret")
    monkeypatch.setenv("FLASHTREE_COMPILE_HELPER", "off")
    target, draft = pair
    r = env_json(capsys, "--model", str(target), "--draft", str(draft))
    assert set(r["switches"]) == set(switches.SWITCHES)
    assert r["switches"]["FLASHTREE_API_KEY"] == "(set)" and r["switches"]["FLASHTREE_COMPILE_HELPER"] == "off"
    assert main(["env", "--model", str(target), "--draft", str(draft)]) == 0
    text = capsys.readouterr().out
    assert "sk-very-secret" not in text and "FLASHTREE_DRAFT_VOCAB" in text
    # an on-by-default switch says whether it is on, not its off meaning as if it were the state
    assert "FLASHTREE_COMPILE_HELPER 'off' = off; set to 0" in text and "FLASHTREE_CPU_KERNEL   unset = on;" in text
    for spelling, off in (("0", True), ("False", True), (" no ", True), ("OFF", True), ("1", False), ("", False)):
        monkeypatch.setenv("FLASHTREE_COMPILE_HELPER", spelling)
        assert switches.is_off("FLASHTREE_COMPILE_HELPER") is off, spelling
    with pytest.raises(KeyError, match="not a flashtree switch"):
        switches.value("FLASHTREE_AMX")
