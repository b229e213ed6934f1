"""Tensor parallelism on CPU: 2 ranks over gloo, spawned by LLM, by `flashtree serve`, or by torchrun.

TP=2 must decode exactly what TP=1 decodes: greedy ar/dflash/ddtree token for token on the bundled
pair and on random qwen3 and llama targets (the llama one with random attention and MLP biases,
so a row-parallel bias added on every rank — or on none — would change the logits), and a
seeded sampled run reproduces TP=1's tokens. Where float sums in another order flip a greedy
near-tie, the test reports the logit gap there and accepts only a gap below 1e-5.
"""
import gc
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch.distributed as dist

from flashtree import LLM, SamplingParams
from flashtree.engine.engine import EngineFailure
from flashtree.errors import UserError
from helpers import make_drafter, make_hf_target, near_tie_gap, write_tokenizer
from serving import free_port, server_up, wait_for

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")

rng = random.Random(0)
PROMPTS = [[rng.randrange(95) for _ in range(rng.randint(3, 30))] for _ in range(4)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama_tp")
    target = make_hf_target(root / "target", "llama", attention_bias=True, mlp_bias=True)
    write_tokenizer(target, 96)
    return target, make_drafter(root / "drafter", target)


def pair_of(which, tiny_pair, llama_pair):
    return {"bundled": ("tiny-code", None), "qwen3": tiny_pair, "llama": llama_pair}[which]


@pytest.mark.parametrize("which", ["bundled", "qwen3", "llama"])
def test_tp2_greedy_equals_tp1(which, tiny_pair, llama_pair):
    model, draft = pair_of(which, tiny_pair, llama_pair)
    prompts = PROMPTS if which != "bundled" else ["def fibonacci(n):\n", "import os\nimport sys\n"]
    one = LLM(model, draft, compile=False)
    two = LLM(model, draft, compile=False, tensor_parallel_size=2)
    try:
        assert two.target.config.num_attention_heads * 2 == one.target.config.num_attention_heads  # sharded
        assert two.engine.runner.cache.k.shape[2] * 2 == one.engine.runner.cache.k.shape[2]  # its KV heads only
        for method in ("ar", "dflash", "ddtree"):
            budget = 16 if method == "ddtree" else None  # a fixed tree: auto may choose plain rounds here
            a = two.generate(prompts, GREEDY, method=method, budget=budget, use_tqdm=False)
            b = one.generate(prompts, GREEDY, method=method, budget=budget, use_tqdm=False)
            for p, x, y in zip(prompts, a, b):
                if x.token_ids != y.token_ids:
                    ids = p if isinstance(p, list) else one.tokenizer.encode(p)
                    gap = near_tie_gap(model or one.model_path, ids, x.token_ids, y.token_ids)
                    assert gap < 1e-5, (which, method, "outputs differ where the logit gap is", gap)
            if method == "ddtree":
                assert max(t for o in a for t in o.metrics.accept_lengths) > 1  # trees were verified
    finally:
        two.close()


def test_tp2_seeded_sampling_reproduces_tp1(tiny_pair):
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    one = LLM(*tiny_pair, compile=False)
    two = LLM(*tiny_pair, compile=False, tensor_parallel_size=2)
    try:
        for method in ("ar", "ddtree"):
            a = [o.token_ids for o in two.generate(PROMPTS, params, method=method, use_tqdm=False)]
            assert a == [o.token_ids for o in one.generate(PROMPTS, params, method=method, use_tqdm=False)]
    finally:
        two.close()


def kill_rank_processes() -> None:
    """Kill this process's tensor-parallel ranks as an operator would: by pid (pgrep), with SIGKILL."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "flashtree.distributed.tp"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert found, "no rank process found"
    for pid in map(int, found):
        os.kill(pid, signal.SIGKILL)
    for pid in map(int, found):  # dead once a zombie (its parent, the LLM, reaps it at close)
        for _ in range(500):
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                    break
            except FileNotFoundError:
                break
            time.sleep(0.01)


def test_a_dead_rank_stops_the_engine_at_once(tiny_pair):
    two = LLM(*tiny_pair, compile=False, tensor_parallel_size=2)
    try:
        two.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
        kill_rank_processes()
        with pytest.raises(EngineFailure, match="tensor-parallel rank stopped answering"):
            two.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    finally:
        two.close()


SHORT = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_a_second_tp_llm_is_refused_while_the_first_is_open_and_works_once_it_is_closed():
    first = LLM("tiny-code", method="ar", compile=False, tensor_parallel_size=2)
    try:
        want = first.generate(["def f(x):"], SHORT, use_tqdm=False)[0].token_ids
        with pytest.raises(UserError, match=r"still open in this process.*llm\.close\(\).*with LLM\(\.\.\.\) as llm"):
            LLM("tiny-code", method="dflash", compile=False, tensor_parallel_size=2)
    finally:
        first.close()
    first.close()  # idempotent
    with pytest.raises(UserError, match="this LLM is closed"):
        first.generate(["def f(x):"], SHORT, use_tqdm=False)
    with LLM("tiny-code", method="dflash", compile=False, tensor_parallel_size=2) as second:
        assert second.generate(["def f(x):"], SHORT, use_tqdm=False)[0].token_ids == want  # greedy dflash == ar
    with pytest.raises(UserError, match="this LLM is closed"):  # leaving `with` closed it
        second.generate(["def f(x):"], SHORT, use_tqdm=False)
    second.close()


def test_a_dropped_tp_llm_is_closed_and_a_second_one_works():
    first = LLM("tiny-code", method="ar", compile=False, tensor_parallel_size=2)
    want = first.generate(["import os\n"], SHORT, use_tqdm=False)[0].token_ids
    del first
    gc.collect()
    with LLM("tiny-code", method="dflash", compile=False, tensor_parallel_size=2) as second:
        assert second.generate(["import os\n"], SHORT, use_tqdm=False)[0].token_ids == want


def test_close_without_tensor_parallelism_is_a_no_op():
    with LLM("tiny-code", method="ar", compile=False) as one:
        one.close()
    one.close()
    assert len(one.generate(["x = "], SHORT, use_tqdm=False)[0].token_ids) == 6  # nothing was released


def test_unshardable_sizes_are_refused_before_loading(tiny_pair):
    with pytest.raises(UserError, match="tensor_parallel_size=3 must divide the target's num_attention_heads"):
        LLM(*tiny_pair, compile=False, tensor_parallel_size=3)
    with pytest.raises(UserError, match="tensor_parallel_size > 1 runs eager"):
        LLM(*tiny_pair, compile=True, tensor_parallel_size=2)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _serve(tiny_pair, port):
    env = {**os.environ, "FLASHTREE_COMPILE": "0"}
    return subprocess.Popen([sys.executable, "-m", "flashtree.cli", "serve", "--model", str(tiny_pair[0]), "--draft",
                             str(tiny_pair[1]), "--tensor-parallel-size", "2", "--port", str(port),
                             "--served-model-name", "tiny", "--log-interval", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_tp2_server_answers_the_openai_client_and_stops_every_rank_on_sigterm(tiny_pair):
    ref = LLM(*tiny_pair, compile=False)
    expect = ref.tokenizer.decode(ref.generate(["hello"], SamplingParams(temperature=0, max_tokens=12),
                                               use_tqdm=False)[0].token_ids)
    port = free_port()
    proc = _serve(tiny_pair, port)
    try:
        assert server_up(proc, f"http://127.0.0.1:{port}")
        workers = _children(proc.pid)
        assert len(workers) == 1  # rank 1, spawned by the server (it opens no port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        r = client.completions.create(model="tiny", prompt="hello", temperature=0, max_tokens=12)
        assert r.choices[0].text == expect.removesuffix(ref.tokenizer.decode([]))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it drained on
        out = proc.stdout.read()
        assert "rank 1 stopped" not in out  # rank 1 was told to stop, it did not lose rank 0
        assert wait_for(lambda: not Path(f"/proc/{workers[0]}").exists() or
                        "zombie" in Path(f"/proc/{workers[0]}/status").read_text(), timeout=20)
    finally:
        proc.kill()


def test_tp2_server_exits_when_a_rank_dies(tiny_pair):
    port = free_port()
    proc = _serve(tiny_pair, port)
    try:
        assert server_up(proc, f"http://127.0.0.1:{port}")
        os.kill(_children(proc.pid)[0], signal.SIGKILL)
        assert proc.wait(timeout=30) == 1  # the idle heartbeat finds the dead rank
        assert "tensor-parallel rank stopped answering" in proc.stdout.read()
    finally:
        proc.kill()


def test_torchrun_two_processes_on_one_machine(tiny_pair):
    """The launch that stands in for two nodes: torchrun starts both ranks; rank 0 runs the command."""
    torchrun = Path(sys.executable).parent / "torchrun"
    ref = LLM(*tiny_pair, compile=False)
    want = ref.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0].token_ids
    prompt = ref.tokenizer.decode(PROMPTS[0])
    ids = ref.tokenizer.encode(prompt)
    want = ref.generate([ids], GREEDY, use_tqdm=False)[0].token_ids
    env = {**os.environ, "FLASHTREE_COMPILE": "0"}
    out = subprocess.run([str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "flashtree.cli", "generate", prompt,
                          "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--tensor-parallel-size", "2",
                          "--max-tokens", "32", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[:4000] + "\n[...]\n" + out.stderr[-2000:]  # a rank's own error comes first
    import json
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["token_ids"] == want
