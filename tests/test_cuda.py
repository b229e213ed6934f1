"""CUDA: speculative greedy decoding equals plain greedy on the GPU, eager and compiled (run by
scripts/gpu_check.sh; skipped without CUDA).

float64 has no near-ties on the tiny random pair, so there the outputs must match token for token:
that checks the GPU's masks, gathers and cache writes, and plain decoding
there against the CPU's. In float32 and bfloat16 a verify of T rows
sums in another order than a one-row step (cuBLAS picks kernels by shape), so greedy runs may part
at a near-tie; the test accepts a parting only where the float64 logit gap is below the dtype's
rounding scale. FLASHTREE_TEST_DEVICE=cpu runs the same checks on the CPU."""
import os

import pytest
import torch

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.models.loader import load_drafter, load_target
from helpers import near_tie_gap

DEVICE = os.environ.get("FLASHTREE_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs CUDA")]
# The largest float64 logit gap at which two greedy runs in this dtype may part: a few units of the
# dtype's rounding on logits of size ~10 after a few layers.
TIE = {"float64": 0.0, "float32": 1e-3, "bfloat16": 0.25}
PROMPTS = [[(7 * i + j) % 90 for j in range(3 + i)] for i in range(6)]


def decode(target, drafter, method, budget, compile):
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=4, max_model_len=128,
                                               compile=compile))
    seqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)) for p in PROMPTS]
    while eng.has_work():
        eng.step()
    return [s.output_ids for s in seqs], [t for s in seqs for t in s.metrics.accept_lengths]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_greedy_speculative_equals_plain_on_cuda(tiny_pair, dtype, compile):
    target = load_target(tiny_pair[0], dtype=dtype, device=DEVICE).fuse()
    drafter = load_drafter(tiny_pair[1], target).fuse()
    ref, _ = decode(target, drafter, "ar", None, compile)
    if dtype == "float64":  # plain decoding on the device is the CPU's, token for token
        cpu = load_target(tiny_pair[0], dtype=dtype, device="cpu")
        assert ref == decode(cpu, load_drafter(tiny_pair[1], cpu), "ar", None, False)[0]
    accepted = []
    for method, budget in [("dflash", None), ("ddtree", 8), ("ddtree", 32)]:
        out, taus = decode(target, drafter, method, budget, compile)
        accepted += taus
        for prompt, a, b in zip(PROMPTS, out, ref):
            if a != b:
                gap = near_tie_gap(tiny_pair[0], prompt, a, b)
                assert gap <= TIE[dtype], (method, budget, dtype, compile, "parted where the logit gap is", gap)
    assert max(accepted) > 1, "no draft token was ever accepted: the verify path went untested"
