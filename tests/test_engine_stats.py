"""The engine's cumulative counters (`EngineStats`): `snapshot` / `since`, and that a real
generation counts what its requests' own metrics say it did."""
from collections import Counter

import pytest

from flashtree import LLM, SamplingParams
from flashtree.engine.round import EngineStats


def test_since_is_the_field_wise_difference_and_a_snapshot_stays_put():
    stats = EngineStats(rounds=2, forwards=2, seqs_in_forwards=3, generated_tokens=5, prefix_hit_tokens=16)
    stats.request_round("ddtree", 4)
    before = stats.snapshot()
    stats.request_round("ddtree", 2)
    stats.request_round("ar", 1)
    stats.forwards += 1
    stats.preemptions += 1
    assert before.request_rounds == 1 and before.rounds_by_method == Counter(ddtree=1)  # the copy did not move
    new = stats.since(before)
    assert (new.request_rounds, new.committed_tokens, new.forwards, new.preemptions) == (2, 3, 1, 1)
    assert (new.rounds, new.generated_tokens, new.prefix_hit_tokens) == (0, 0, 0)
    assert new.rounds_by_method == Counter(ddtree=1, ar=1)
    assert stats.since(stats.snapshot()) == EngineStats()


@pytest.fixture(scope="module")
def llm():
    with LLM("tiny-code", method="ddtree", budget=8, compile=False, max_batch_size=4) as llm:
        yield llm


def test_a_generations_counters_agree_with_its_requests_metrics(llm):
    """Over a short mixed-method batch on the tiny-code pair: one request-round per committed round
    of each request, their taus summed, every output token emitted once, and (nothing failing)
    one forward per round carrying every decoding request."""
    eng = llm.engine
    llm.generate(["def add(a, b):\n"], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = eng.stats.snapshot()  # what came before is not this generation's
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seqs = [eng.add_request(prompt, params, method=method) for prompt, method in
            [(llm.tokenizer.encode("import os\n\n\ndef list_files(path):\n"), "ddtree"),
             (llm.tokenizer.encode("class Stack:\n    def push(self, x):\n"), "ar"),
             (llm.tokenizer.encode("for i in range(10):\n"), "dflash")]]
    while eng.has_work():
        eng.step()
    new = eng.stats.since(before)
    assert new.request_rounds == sum(s.metrics.rounds for s in seqs) > 0
    assert new.committed_tokens == sum(sum(s.metrics.accept_lengths) for s in seqs)
    assert new.committed_tokens > new.request_rounds  # some drafts were accepted: tau is not always 1
    assert new.generated_tokens == sum(len(s.output_ids) for s in seqs) == 3 * 24
    assert new.rounds_by_method == Counter({s.method: s.metrics.rounds for s in seqs})
    assert new.forwards == new.rounds > 0 and new.seqs_in_forwards == new.request_rounds
