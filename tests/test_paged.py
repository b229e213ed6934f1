"""The paged KV cache in the engine: prefix caching, chunked prefill, preemption, capacity errors.

Every check compares against the same engine with the feature off (or at C=1): greedy outputs
must be identical token for token, and the feature must demonstrably have acted (hits counted,
chunks run, preemptions happened) — else the comparison proves nothing.
"""
import random

import pytest

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.errors import UserError

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def engine(models, **kw):
    target, drafter = models
    kw = {"method": "ddtree", "max_model_len": 160, "page_size": 4, **kw}
    return Engine(target, drafter, EngineConfig(**kw))


def drain(eng, prompts, params=GREEDY, method=None, per_step=None):
    """Run prompts to completion; per_step(eng, events) is called after every step."""
    seqs = [eng.add_request(p, params, method=method) for p in prompts]
    while eng.has_work():
        events = eng.step()
        if per_step:
            per_step(eng, events)
    assert eng.blocks.free_slots == eng.blocks.num_slots and eng.blocks.used == 0  # every page back
    return [s.output_ids for s in seqs]


def shared_prefix_prompts(n, prefix_len=37, seed=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(95) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(95) for _ in range(rng.randint(1, 9))] for _ in range(n)]


@pytest.mark.parametrize("method", ["ar", "dflash", "ddtree", "hybrid"])
def test_prefix_hits_across_requests_with_different_suffixes_change_no_token(models, method):
    prompts = shared_prefix_prompts(6)
    cold = drain(engine(models, enable_prefix_caching=False, method=method), prompts)
    eng = engine(models, method=method)
    warm = [drain(eng, [p])[0] for p in prompts]  # one at a time: each later request can hit the earlier pages
    assert warm == cold
    # requests 2..6 each reuse the 9 full pages (36 tokens) of the shared prefix
    assert eng.stats.prefix_hit_tokens == 5 * 36, eng.stats.prefix_hit_tokens
    assert drain(eng, prompts) == cold  # and all at once, with the pages cached from before


@pytest.fixture(scope="module")
def code_pair():
    """The bundled tiny-code pair (a trained drafter: its drafts are accepted on code)."""
    from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.tokenizer import Tokenizer
    target = load_target(BUNDLED_TARGET, dtype="float32", device="cpu")
    prompt = Tokenizer(BUNDLED_TARGET).encode("import os\n\n\ndef list_files(path):\n    \"\"\"Return the files under path.\"\"\"\n")
    return (target, load_drafter(BUNDLED_DRAFTER, target)), prompt


@pytest.mark.parametrize("first", ["ar", "ngram", "one-token", "auto"])
@pytest.mark.parametrize("later", ["dflash", "ddtree"])
def test_drafter_requests_reuse_the_pages_any_method_filled(code_pair, first, later):
    """Whatever the first request decoded (plainly, with n-grams, one token only, auto), a
    drafter-based request sharing its prompt and answer hits its pages — drafter context
    included: tokens and acceptance equal a cold engine's."""
    models, prompt = code_pair
    eng = engine(models)
    params = GREEDY if first != "one-token" else SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    method = {"one-token": "ddtree", "auto": "ddtree"}.get(first, first)
    s0 = eng.add_request(prompt, params, method=method)
    while eng.has_work():
        eng.step()
    follow = prompt + s0.output_ids + [5, 7, 11]  # the next turn: the prompt, the answer, more
    cold_eng = engine(models, enable_prefix_caching=False)
    fixed = {"budget": 8} if later == "ddtree" else {}  # (auto's choices follow timings)
    cold = cold_eng.add_request(follow, GREEDY, method=later, **fixed)
    warm = eng.add_request(follow, GREEDY, method=later, **fixed)
    for e in (cold_eng, eng):
        while e.has_work():
            e.step()
    assert warm.output_ids == cold.output_ids
    assert warm.metrics.accept_lengths == cold.metrics.accept_lengths  # the same drafter context
    assert max(cold.metrics.accept_lengths) > 1                        # (which drafted at all)
    full = (len(prompt) + len(s0.output_ids) - 1) // 4  # the first request's full pages
    assert eng.stats.prefix_hit_tokens == 4 * full, (eng.stats.prefix_hit_tokens, full)


def test_a_fully_cached_prompt_still_computes_its_last_token(models):
    prompt = shared_prefix_prompts(1, prefix_len=40)[0][:40]  # 10 full pages exactly
    eng = engine(models)
    first = drain(eng, [prompt])
    assert drain(eng, [prompt]) == first
    assert eng.stats.prefix_hit_tokens == 36  # 9 pages: the 10th holds the token whose logits are needed


def test_a_steps_prefill_chunks_pad_to_no_more_than_the_budget_and_change_no_token(models):
    """A prefill forward computes (sequences x the longest chunk) rows: the budget counts those.
    Prompts of 50, 40 and 5 tokens under a 64-row budget go as 32 + 32 (64 rows), not 50 + 14
    (100 rows, 36 of them padding); every step stays within the budget, outputs unchanged."""
    rng = random.Random(2)
    prompts = [[rng.randrange(95) for _ in range(n)] for n in (50, 40, 5)]
    ref = drain(engine(models, method="ar", enable_prefix_caching=False), prompts)
    eng = engine(models, method="ar", max_batch_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    seqs = [eng.add_request(p, GREEDY) for p in prompts]
    steps = []  # each prefill step's chunks
    while eng.has_work():
        before = [s.prefilled for s in seqs]
        eng.step()
        grown = [s.prefilled - b for s, b in zip(seqs, before) if s.prefilled > b]
        if grown:
            steps.append(grown)
    assert [s.output_ids for s in seqs] == ref
    assert steps[0] == [32, 32] and all(len(g) * max(g) <= 64 for g in steps), steps
    # then 18 + 8 + 5 (54 rows); in order, filling the budget: 50 + 14 (100 rows), then 26 + 5 (52)
    assert sum(len(g) * max(g) for g in steps) < 100 + 52


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_chunked_prefill_interleaves_with_running_rounds_and_changes_no_token(models, method):
    rng = random.Random(1)
    short = [[rng.randrange(95) for _ in range(5)] for _ in range(3)]
    long = [rng.randrange(95) for _ in range(120)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = drain(engine(models, method=method, enable_prefix_caching=False), short + [long], params)
    eng = engine(models, method=method, max_num_batched_tokens=16, enable_prefix_caching=False)
    seqs = [eng.add_request(p, params) for p in short]
    eng.step()  # the short prompts are admitted and decoding
    seqs.append(eng.add_request(long, params))
    steps_prefilling, short_tokens = 0, 0
    while eng.has_work():
        events = eng.step()
        if not seqs[-1].decoding:
            steps_prefilling += 1
            short_tokens += sum(len(e.new_ids) for e in events if e.seq is not seqs[-1])
    assert [s.output_ids for s in seqs] == ref
    assert steps_prefilling >= 120 // 16 - 1  # the long prompt took several steps ...
    assert short_tokens >= steps_prefilling  # ... and the running streams advanced in each of them


def test_paced_chunks_cost_at_most_the_stall_and_shrink_as_the_context_grows():
    """Beside decoding streams a step's chunks may cost `stall` rounds by the learned time per unit of
    work; a row late in a prompt attends more keys, so the same allowance buys fewer rows there."""
    from types import SimpleNamespace

    from flashtree.engine.prefill_pacing import MIN_ROWS, PrefillPacer, prefill_work
    from flashtree.engine.scheduler import chunks
    pacer = PrefillPacer(break_even=500.0, stall=3.0, unit_s=1e-4, round_s=2e-3)  # allowance 6 ms = 60 units
    assert pacer.fits(decoding=False) is None and PrefillPacer(500.0, 3.0).fits(decoding=True) is None
    seq = SimpleNamespace(cache_ids=list(range(5000)), prefilled=0, chunk=256)  # what `chunks` reads of a Sequence
    sizes = []
    for start in (1, 400, 1000):
        seq.prefilled = start
        [chosen] = chunks([seq], 256, pacer.fits(decoding=True))
        work = prefill_work([start], chosen.chunk, 500.0)
        assert 1e-4 * work <= 6e-3 < 1e-4 * prefill_work([start], chosen.chunk + 1, 500.0)  # the largest that fits
        sizes.append(chosen.chunk)
    assert sizes[0] > sizes[1] > sizes[2] >= 1 and sizes[0] < 256, sizes
    seq.prefilled = 4000  # nothing fits: still MIN_ROWS rows (every prompt progresses)
    assert chunks([seq], 256, pacer.fits(decoding=True))[0].chunk == MIN_ROWS


def test_a_paced_prompt_starts_with_small_chunks_and_grows_them_at_most_twofold():
    """The learned time per unit may come from unlike forwards (other methods' prefills, short
    prompts), so a prompt beside decoding streams starts at MIN_ROWS rows and each chunk at most
    doubles the one before, up to what the allowance buys."""
    from types import SimpleNamespace

    from flashtree.engine.prefill_pacing import MIN_ROWS, PrefillPacer
    from flashtree.engine.scheduler import chunks
    pacer = PrefillPacer(break_even=500.0, stall=3.0, unit_s=1e-6, round_s=2e-3)  # a cheap guess: 6,000 units
    seq = SimpleNamespace(cache_ids=list(range(5000)), prefilled=0, chunk=0)
    sizes = []
    while len(sizes) < 7:
        [chosen] = chunks([seq], 256, pacer.fits(decoding=True))
        sizes.append(chosen.chunk)
        seq.prefilled += chosen.chunk
    assert sizes == [MIN_ROWS, 2 * MIN_ROWS, 4 * MIN_ROWS, 8 * MIN_ROWS, 16 * MIN_ROWS, 256, 256], sizes
    assert chunks([seq], 256, None)[0].chunk == 256  # unpaced (nothing decodes): the whole row budget


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_a_long_prompt_beside_streams_is_paced_and_changes_no_token(models, method):
    """4 streams decode; a 400-token prompt arrives. Its chunks while they decode are paced below the
    row budget (the default `prefill_stall`), the streams advance in every step it prefills, and
    every output equals the unpaced engine's."""
    rng = random.Random(3)
    short = [[rng.randrange(95) for _ in range(5)] for _ in range(4)]
    long = [rng.randrange(95) for _ in range(400)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)

    def run(**kw):
        eng = engine(models, method=method, max_model_len=480, enable_prefix_caching=False, **kw)
        seqs = [eng.add_request(p, params) for p in short]
        eng.step()
        eng.step()  # the streams decode, their rounds timed
        seqs.append(eng.add_request(long, params))
        chunk_sizes = []
        while eng.has_work():
            before = seqs[-1].prefilled
            eng.step()
            if seqs[-1].prefilled > before:
                chunk_sizes.append(seqs[-1].prefilled - before)
        return [s.output_ids for s in seqs], chunk_sizes

    ref, unpaced = run(prefill_stall=None)
    out, paced = run()
    assert out == ref
    assert unpaced == [256, 144]
    assert len(paced) > 2 and max(paced) < 256, paced


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_preemption_when_pages_run_out_recomputes_and_changes_no_token(models, method):
    rng = random.Random(2)
    prompts = [[rng.randrange(95) for _ in range(rng.randint(20, 40))] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    ref = [drain(engine(models, method=method, max_batch_size=1), [p], params)[0] for p in prompts]
    # room for ~4 prompts + 60 tokens: 6 growing sequences must preempt one another
    eng = engine(models, method=method, max_batch_size=6, kv_cache_tokens=400, max_budget=16,
                 enable_prefix_caching=method == "ddtree")
    assert drain(eng, prompts, params) == ref
    assert eng.stats.preemptions > 0


def test_memory_follows_kv_cache_tokens_not_slots_times_context(models):
    eng = engine(models, max_batch_size=64, max_model_len=2048, kv_cache_tokens=16384, page_size=16)
    rows = eng.runner.cache.k.shape[1]
    assert rows == 16384 + 16  # the pages asked for, plus the null page
    assert eng.blocks.capacity_tokens == 16384


@pytest.mark.parametrize("kw, msg", [
    (dict(kv_cache_tokens=100), "kv_cache_tokens=100 cannot hold one sequence"),
    (dict(page_size=0), "page_size must be an integer in [1, 1024]"),
    (dict(kv_cache_tokens=0), "kv_cache_tokens must be a positive integer"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be a positive integer"),
    (dict(prefill_stall=0), "prefill_stall must be a number > 0"),
    (dict(prefill_stall="3"), "prefill_stall must be a number > 0"),
])
def test_out_of_range_cache_options_are_refused_at_start(models, kw, msg):
    with pytest.raises(UserError) as e:
        engine(models, **kw)
    assert msg in str(e.value)


def test_everything_at_once_changes_no_token(models):
    """Shared prefixes (hits), chunked prefill, a cache small enough to preempt, every method in
    one batch: each request's greedy output equals the same request run alone, unconstrained."""
    rng = random.Random(5)
    prefix = [rng.randrange(95) for _ in range(30)]
    methods = ["ar", "ngram", "dflash", "ddtree", "hybrid"]
    reqs = [(prefix[:rng.choice([0, 12, 30])] + [rng.randrange(95) for _ in range(rng.randint(2, 25))],
             methods[i % len(methods)]) for i in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    alone = [drain(engine(models, enable_prefix_caching=False, max_batch_size=1), [p], params, method=m)[0]
             for p, m in reqs]
    eng = engine(models, max_batch_size=6, kv_cache_tokens=200, max_budget=16, max_num_batched_tokens=24)
    seqs = [eng.add_request(p, params, method=m) for p, m in reqs]
    while eng.has_work():
        eng.step()
    assert [s.output_ids for s in seqs] == alone
    assert eng.stats.preemptions > 0 and eng.stats.prefix_hit_tokens > 0
    assert eng.blocks.used == 0 and eng.blocks.free_slots == 6


def test_reset_prefix_cache_makes_the_next_request_prefill_again(models):
    prompts = shared_prefix_prompts(2)
    eng = engine(models)
    first = drain(eng, prompts[:1])
    seq = eng.add_request(prompts[1], GREEDY)
    eng.step()
    assert not eng.reset_prefix_cache()  # a request holds pages: refused
    while eng.has_work():
        eng.step()
    hits = eng.stats.prefix_hit_tokens
    assert hits == 36 and seq.output_ids
    assert eng.reset_prefix_cache()
    assert drain(eng, prompts[:1]) == first and eng.stats.prefix_hit_tokens == hits  # no new hit


def test_a_round_keeps_the_pages_its_next_round_reserves_and_no_more(models):
    """After each commit a sequence keeps the pages reserved past its length for the next round,
    up to its length plus one round's largest tree (trimming them to its length made the next
    schedule take them again every step)."""
    eng = engine(models, method="ddtree", budget=8)
    s = eng.add_request(shared_prefix_prompts(1)[0], GREEDY)
    kept = steps = 0
    while eng.has_work():
        eng.step()
        if not s.finished and s.decoding:
            held, P = len(eng.blocks.pages[s.slot]), eng.blocks.pages_for
            assert P(s.length) <= held <= P(s.length + max(s.budget + 1, s.block_size)), (s.length, held)
            kept += held > P(s.length)
            steps += 1
    assert steps >= 2 and kept > steps / 2, (kept, steps)
    assert eng.blocks.used == 0
