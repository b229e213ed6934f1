"""The Python API: greedy ar equals transformers' generate; chat template; stops; the CLI."""
import io
import json
import subprocess
import sys

import pytest
import torch

from flashtree import LLM, SamplingParams
from flashtree.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def llm(tiny_pair):
    return LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ar", dtype="float32", device="cpu", max_batch_size=4)


def test_greedy_ar_equals_transformers_generate(llm, tiny_pair):
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    prompts = [[5, 9, 2], [17, 3, 44, 8, 1, 90, 12], [60]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(p):].tolist()
        assert o.token_ids == ref
        assert o.finish_reason == "length" and o.metrics.completion_tokens == 20
        assert o.metrics.rounds == 19 and o.metrics.mean_accept_length == 1.0


def test_text_prompts_chat_template_and_stop_strings(llm):
    tok = llm.tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "t5 t6"}]) == "t5 t6 "
    full = llm.generate("t5 t6", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    words = full.text.split()
    stop = words[4]
    cut = llm.generate("t5 t6", SamplingParams(temperature=0, max_tokens=12, stop=[stop], ignore_eos=True))[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert full.text.startswith(cut.text)
    chat = llm.chat([{"role": "user", "content": "t5 t6"}], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert chat.token_ids == full.token_ids
    with pytest.raises(ValueError, match="messages"):
        llm.chat([[]])


def test_eos_ids_from_config_and_generation_config(tiny_pair, tmp_path):
    import shutil
    d = tmp_path / "t"
    shutil.copytree(tiny_pair[0], d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert Tokenizer(d).eos_token_ids == [7, 9]


def test_per_prompt_params_and_streaming(llm):
    ps = [SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)]
    a, b = llm.generate([[3, 4], [3, 4]], ps)
    assert len(a.token_ids) == 5 and b.token_ids[:5] == a.token_ids
    streamed = "".join(llm.stream([3, 4], ps[1]))
    assert streamed == b.text


def test_cli_generate_json(tiny_pair):
    r = subprocess.run([sys.executable, "-m", "flashtree.cli", "generate", "t1 t2", "--model", str(tiny_pair[0]),
                        "--draft", str(tiny_pair[1]), "--method", "ddtree", "--budget", "8", "--max-tokens", "10",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["token_ids"]) == 10 and out["finish_reason"] == "length"
    assert out["metrics"]["rounds"] == len(out["metrics"]["accept_lengths"])
    r = subprocess.run([sys.executable, "-m", "flashtree.cli", "generate", "t1 t2", "--model", str(tiny_pair[0]),
                        "--method", "ar", "--max-tokens", "6"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("t1 t2") and "tok/s" in r.stderr


def _ids_alone(llm, prompt, params):
    return llm.generate([prompt], params, use_tqdm=False)[0].token_ids


def test_generate_streams_prompts_past_the_queue_cap(tiny_pair):
    small = LLM(model=tiny_pair[0], method="ar", dtype="float32", device="cpu", max_batch_size=2, max_queue=4)
    prompts = [[3 + i, 40 - i] for i in range(10)]
    ps = [SamplingParams(temperature=0, max_tokens=2 + i % 4, ignore_eos=True) for i in range(10)]
    outs = small.generate(prompts, ps)
    assert [o.prompt for o in outs] == prompts
    assert [o.token_ids for o in outs] == [_ids_alone(small, p, sp) for p, sp in zip(prompts, ps)]
    assert not small.engine.has_work()


def test_generate_takes_more_prompts_than_the_default_queue(tiny_pair):
    llm = LLM(model=tiny_pair[0], method="ar", dtype="float32", device="cpu", max_batch_size=64, max_model_len=32)
    assert llm.engine.config.max_queue == 1024
    n = 1100
    prompts = [[1 + i % 90, 2] for i in range(n)]
    ps = [SamplingParams(temperature=0, max_tokens=1 + i % 3, ignore_eos=True) for i in range(n)]
    outs = llm.generate(prompts, ps)
    refs = {(p[0], sp.max_tokens): _ids_alone(llm, p, sp) for p, sp in zip(prompts[:270], ps[:270])}
    assert [o.token_ids for o in outs] == [refs[p[0], sp.max_tokens] for p, sp in zip(prompts, ps)]


def test_generate_aborts_its_requests_on_a_bad_prompt_midway(tiny_pair):
    small = LLM(model=tiny_pair[0], method="ar", dtype="float32", device="cpu", max_batch_size=2, max_queue=4)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(ValueError, match="empty") as err:
        small.generate([[5, 6]] * 6 + [[]], params)
    assert "prompt 6 of 7" in "".join(err.value.__notes__)
    assert not small.engine.has_work() and not small.engine.running
    assert small.generate([[5, 6]], params)[0].token_ids == small.generate([[5, 6]] * 3, params)[2].token_ids


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(llm, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for stream, use_tqdm, shown in ((_Tty(), True, True), (_Tty(), False, False), (io.StringIO(), True, False)):
        monkeypatch.setattr(sys, "stderr", stream)
        llm.generate([[1, 2], [3, 4], [5, 6]], params, use_tqdm=use_tqdm)
        assert ("3/3" in stream.getvalue()) == shown, stream.getvalue()


def test_the_default_method_is_hybrid_with_a_drafter_and_ngram_without(tiny_pair):
    """method=None: hybrid where the model has a drafter, ngram where it has none, both with budget
    auto (plain rounds where drafting does not pay); greedy output equals plain decoding's."""
    with_drafter = LLM(model=tiny_pair[0], draft=tiny_pair[1], dtype="float32", device="cpu", max_batch_size=2)
    without = LLM(model=tiny_pair[0], dtype="float32", device="cpu", max_batch_size=2)
    assert with_drafter.method == "hybrid" and without.method == "ngram"
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompt = [[5, 9, 2, 5, 9, 2, 5, 9]]
    plain = with_drafter.generate(prompt, greedy, method="ar")[0].token_ids
    assert with_drafter.generate(prompt, greedy)[0].token_ids == plain
    assert without.generate(prompt, greedy)[0].token_ids == plain


def test_loading_a_model_imports_no_compiler_stack():
    """Building the model on the meta device and loading it leaves torch's compiler stack alone:
    `normal_` and `arange` on meta ran through torch's reference ops, which import dynamo and
    triton (~1 s at start, ~65 MB resident; with the C++ package loader for compiled graphs, an
    AVX2 `LLM()` peaked at 757 MB before, 527 after: benchmarks/memory_2026-12-07)."""
    code = ("import sys; from flashtree import LLM; LLM('tiny-code', compile=False); "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
