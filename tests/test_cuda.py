"""CUDA: greedy speculative decoding equals plain greedy on the GPU, eager and compiled, fp32 and
bf16 (run by scripts/gpu_check.sh; skipped without CUDA)."""
import pytest
import torch

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.models.loader import load_drafter, load_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_speculative_equals_plain_on_cuda(tiny_pair, dtype, compile):
    target = load_target(tiny_pair[0], dtype=dtype, device="cuda").fuse()
    drafter = load_drafter(tiny_pair[1], target).fuse()
    prompts = [[(7 * i + j) % 90 for j in range(3 + i)] for i in range(6)]

    def run(method, budget=None):
        eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=4, max_model_len=128,
                                                   compile=compile))
        seqs = [eng.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
        while eng.has_work():
            eng.step()
        return [s.output_ids for s in seqs], [t for s in seqs for t in s.metrics.accept_lengths]
    ref, _ = run("ar")
    for method, budget in [("dflash", None), ("ddtree", 8), ("ddtree", 32)]:
        out, taus = run(method, budget)
        assert out == ref, (method, budget, dtype, compile)
