"""With a drafter that knows the target's own greedy continuation, every round accepts the whole block."""
import numpy as np

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.models.loader import load_drafter, load_target
from flashtree.speculative.tree import DraftOutput


def test_oracle_drafter_reaches_block_size(tiny_pair):
    target = load_target(tiny_pair[0], dtype="float64", device="cpu")
    drafter = load_drafter(tiny_pair[1], target)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = Engine(target, None, EngineConfig(method="ar", max_model_len=128))
    seq = ref.add_request(prompt, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    while ref.has_work():
        ref.step()
    truth = prompt + seq.output_ids
    V = target.config.vocab_size

    for method, budget in (("dflash", None), ("ddtree", 12)):
        eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_model_len=128))

        def oracle(batch):  # replaces the drafter pass: the true next tokens, rank 0 with log-prob 0
            out = {}
            for s in batch:
                pos = len(s.prompt_ids) + len(s.output_ids)
                L = s.block_size - 1
                ids = np.zeros((L, 2), dtype=np.int64)
                ids[:, 0] = truth[pos:pos + L]
                ids[:, 1] = (ids[:, 0] + 1) % V
                out[s] = DraftOutput(np.tile([0.0, -5.0], (L, 1)), ids)
            return out

        eng.drafts.source = oracle
        s = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=57, ignore_eos=True))
        while eng.has_work():
            eng.step()
        assert s.output_ids == seq.output_ids[:57]
        assert s.metrics.accept_lengths == [8] * 7, (method, s.metrics.accept_lengths)
