"""The server survives any request (issue 14): one regression test per way a request once broke it.

Each test drives the public API or HTTP, and each checks what a client and an operator see: the
status and OpenAI error body, that other requests are untouched, that no KV slot leaks and that
/health tells the truth.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from flashtree import LLM, SamplingParams
from flashtree.engine.engine import EngineFailure, RequestError
from flashtree.engine.round import verify_round
from flashtree.server.app import create_app
from flashtree.server.limits import ServerLimits
from flashtree.tokenizer import Tokenizer
from helpers import make_drafter, make_hf_target, write_tokenizer
from serving import Running, free_port, metric, server_up, wait_for

CONTEXT = 512
BUNDLED_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "src", "flashtree", "bundled", "target")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    target = make_hf_target(d / "target", max_position_embeddings=CONTEXT)
    write_tokenizer(target, 96)
    return str(target), str(make_drafter(d / "draft", target, block_size=4))


def serve(pair, limits=None, http=None, **kw):
    llm = LLM(model=pair[0], draft=pair[1], method=kw.pop("method", "ddtree"), max_batch_size=kw.pop("batch", 4))
    return Running(create_app(llm, model_name="tiny", limits=limits, **kw), **({"http": http} if http else {}))


@pytest.fixture(scope="module")
def server(pair):
    r = serve(pair, ServerLimits(max_body_bytes=64 * 1024, max_request_tokens=4000), api_key=None)
    yield r
    r.stop()


def post(base, path="/v1/completions", timeout=60, **body):
    return httpx.post(base + path, json={"model": "tiny", **body}, timeout=timeout)


def greedy(server, prompt, n=12, method="ar"):
    r = post(server.base, prompt=prompt, temperature=0, max_tokens=n, speculative={"method": method})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def assert_error(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def idle(server):
    return (wait_for(lambda: metric(server.base, "flashtree_kv_slots_used") == 0)
            and metric(server.base, "flashtree_running_requests") == 0
            and httpx.get(server.base + "/health").status_code == 200)


# -------------------------------------------------------------------- 1. integers past int64
def test_1_huge_top_k_is_a_400_and_leaks_nothing(server):
    before = greedy(server, "t1 t2 t3")
    for top_k in (2**63, 2**63 - 1, 97, 10**30):
        r = post(server.base, prompt="x", n=8, top_k=top_k, temperature=1, max_tokens=4)
        assert_error(r, 400, "top_k")
    assert idle(server)
    assert greedy(server, "t1 t2 t3") == before
    assert post(server.base, prompt="t1", top_k=96, temperature=1, max_tokens=4).status_code == 200
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=2**63)


def test_1_seed_and_ints_out_of_range_name_their_field(server):
    assert_error(post(server.base, prompt="t1", seed=2**64, max_tokens=2), 400, "seed")
    assert_error(post(server.base, prompt="t1", max_tokens=2**63), 400)
    r = post(server.base, prompt="t1", seed=2**64 - 1, n=2, temperature=1, max_tokens=2)  # choice 1 wraps
    assert r.status_code == 200, r.text
    assert_error(post(server.base, prompt="t1", stop_token_ids=[2**63], max_tokens=2), 400, "stop_token_ids")


# -------------------------------------------------------------------- 2 and 3. floats after the cast
@pytest.mark.parametrize("field,value", [("temperature", 1e-40), ("temperature", 1e-46), ("temperature", 5e-324),
                                         ("temperature", 1e-5), ("top_p", 1e-300), ("top_p", 1e-46)])
def test_2_values_float32_cannot_carry_are_400s(server, field, value):
    assert_error(post(server.base, prompt="t1", max_tokens=4, **{field: value}), 400, field)
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_2_a_bad_request_does_not_end_the_batch(server):
    """A long stream keeps going while bad requests come and go."""
    ref = greedy(server, "t5 t6", n=200)
    done = {}

    def long_stream():
        body = {"model": "tiny", "prompt": "t5 t6", "temperature": 0, "max_tokens": 200, "stream": True,
                "speculative": {"method": "ar"}}
        text, finish = "", None
        with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ch = json.loads(line[6:])["choices"]
                    if ch:
                        text += ch[0]["text"]
                        finish = ch[0]["finish_reason"] or finish
        done["text"], done["finish"] = text, finish
    t = threading.Thread(target=long_stream)
    t.start()
    for _ in range(5):
        assert_error(post(server.base, prompt="x", temperature=1e-40, n=4, max_tokens=4), 400, "temperature")
        assert_error(post(server.base, prompt="x", top_p=1e-300, max_tokens=4), 400, "top_p")
    t.join(60)
    assert done == {"text": ref, "finish": "length"}
    assert idle(server)


def test_3_smallest_temperature_is_greedy_and_zero_mass_never_samples(pair):
    """The documented minimum temperature runs (here as greedy); 0 < T < it is refused."""
    from flashtree.sampling_params import MIN_TEMPERATURE
    llm = LLM(model=pair[0], draft=pair[1], method="ddtree")
    g = llm.generate(["t3 t4"], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].text
    for seed in (1, 2, 3):
        o = llm.generate(["t3 t4"], SamplingParams(temperature=MIN_TEMPERATURE, max_tokens=24, seed=seed),
                         use_tqdm=False)[0]
        assert o.text == g
        assert o.metrics.mean_accept_length >= 1
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=MIN_TEMPERATURE / 2)


# -------------------------------------------------------------------- failure isolation
def poison_verify(bad_token: int):
    """A verifier that fails every forward whose trees hold `bad_token` at the root (one request)."""
    def verifier(batch, vin, logits, draw):
        if (vin.tokens[:, 0] == bad_token).any():
            raise RuntimeError("injected failure")
        return verify_round(batch, vin, logits, draw)
    return verifier


@pytest.mark.parametrize("method", ["ar", "ddtree"])  # ddtree: budget auto, whose verdict the reruns share
def test_a_failing_sequence_fails_alone(pair, method):
    llm = LLM(model=pair[0], draft=pair[1], method=method, max_batch_size=4)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = ["t1 t2", "t7 t8 t9", "t30 t31", "t40"]
    ref = llm.generate(prompts, params, use_tqdm=False)
    # pick a token only the third prompt's output produces; a verifier that chokes on it
    others = {t for i, o in enumerate(ref) if i != 2 for t in o.token_ids}
    bad = next(t for t in ref[2].token_ids[:-1] if t not in others)
    llm.engine.verifier = poison_verify(bad)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert outs[2].finish_reason == "error"
    for i in (0, 1, 3):
        assert (outs[i].text, outs[i].finish_reason) == (ref[i].text, "length")
    assert llm.engine.blocks.free_slots == llm.engine.blocks.num_slots
    llm.engine.verifier = verify_round
    assert [o.text for o in llm.generate(prompts, params, use_tqdm=False)] == [o.text for o in ref]


class FailsOnPrefill:
    """A method's proposer that raises when told of one request's prefill (its bookkeeping after
    the forward): every other call goes to the engine's own proposer."""
    def __init__(self, inner, req_id: int):
        self.inner, self.req_id = inner, req_id

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def on_prefill(self, seq, rows):
        if seq.req_id == self.req_id:
            raise RuntimeError("injected failure after the prefill's forward")
        self.inner.on_prefill(seq, rows)


def tiny_engine(pair, method, decode=None, **kw):
    """An engine on the tiny pair (float32, batch 4); `decode`: its ids -> text (stop strings)."""
    from flashtree.engine.engine import Engine, EngineConfig
    from flashtree.models.loader import load_drafter, load_target
    target = load_target(pair[0], dtype="float32", device="cpu")
    return Engine(target, load_drafter(pair[1], target), EngineConfig(method=method, max_batch_size=4,
                                                                      max_model_len=128, **kw), decode=decode)


def run_to_end(eng, prompts, params, max_steps=200):
    """Add `prompts` and step until the engine is idle; its sequences for them."""
    seqs = [eng.add_request(p, params) for p in prompts]
    for _ in range(max_steps):
        if not eng.has_work():
            return seqs
        eng.step()
    raise AssertionError(f"the engine still has work after {max_steps} steps")


@pytest.mark.parametrize("method", ["ar", "ddtree"])
@pytest.mark.parametrize("fails_at", [1, 4])  # its first token (the prefill's draw), a later round's commit
def test_a_sequence_whose_commit_fails_fails_alone(pair, method, fails_at):
    """A commit that raises for one sequence (here its stop strings' decode, the engine's injected
    `decode`, once its text has `fails_at` tokens) ends that sequence with "error"; the others
    decode exactly as without it, and no slot or page is left behind. (At the prefill's draw this
    once ended the process: the batch's prefill was rerun per sequence with nothing left to
    prefill, and the attention kernel divided by zero.)"""
    tokenizer = Tokenizer(pair[0])

    def decode(ids):
        if len(ids) >= fails_at:
            raise UnicodeError("this decoder cannot read these ids")
        return tokenizer.decode(ids)

    def run(with_failing: bool):
        eng = tiny_engine(pair, method, decode=decode)
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        seqs = [eng.add_request(tokenizer.encode(p), params) for p in ("t1 t2", "t7 t8 t9", "t40")]
        if with_failing:  # only a request with stop strings decodes its text
            seqs.insert(1, eng.add_request(tokenizer.encode("t30 t31"), SamplingParams(
                temperature=0, max_tokens=10, ignore_eos=True, stop=["t5"])))
        while eng.has_work():
            eng.step()
        assert eng.blocks.free_slots == eng.blocks.num_slots
        return eng, seqs

    _, alone = run(False)
    eng, seqs = run(True)
    failed = seqs.pop(1)
    assert failed.finish_reason == "error" and "UnicodeError: this decoder cannot read these ids" in failed.error
    assert len(failed.output_ids) >= fails_at
    assert [(s.output_ids, s.finish_reason) for s in seqs] == [(s.output_ids, "length") for s in alone]
    assert eng.consecutive_failures == 0  # the others committed after it


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_a_sequence_failing_after_its_prefill_fails_alone(pair, method):
    """A failure after the prefill's forward, in one sequence's bookkeeping, ends that sequence
    with "error"; the forward is not rerun, so the others, already advanced past their prompts,
    decode exactly as without it. (Rerun per sequence, their chunks were empty: the forward read
    a logit at index -1 and a sequence drew a first token from it, or never decoded.)"""
    tokenizer = Tokenizer(pair[0])
    prompts = [tokenizer.encode(p) for p in ("t1 t2", "t7 t8 t9", "t30 t31", "t40")]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone = run_to_end(tiny_engine(pair, method), prompts[:2] + prompts[3:], params)
    eng = tiny_engine(pair, method)
    eng.proposers[method] = FailsOnPrefill(eng.proposers[method], req_id=2)
    seqs = run_to_end(eng, prompts, params)
    failed = seqs.pop(2)
    assert failed.finish_reason == "error" and "injected failure" in failed.error and not failed.output_ids
    assert [(s.output_ids, s.finish_reason) for s in seqs] == [(s.output_ids, "length") for s in alone]
    assert eng.blocks.free_slots == eng.blocks.num_slots


def test_a_failing_auto_verdict_fails_no_request(pair, caplog):
    """budget auto's plain-or-draft verdict only sizes drafts: when it raises, the round drafts
    to each sequence's limit, logged, and every request decodes what plain decoding does."""
    from flashtree.speculative.costs import CostTable

    class VerdictFails(CostTable):
        @property
        def measured(self):  # read by the verdict alone
            raise RuntimeError("injected failure in the verdict")

    tokenizer = Tokenizer(pair[0])
    prompts = [tokenizer.encode(p) for p in ("t1 t2", "t7 t8 t9")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = run_to_end(tiny_engine(pair, "ar"), prompts, params)
    eng = tiny_engine(pair, "ddtree")
    eng.adaptive.costs = VerdictFails(learn=False)
    with caplog.at_level(logging.ERROR, logger="flashtree.engine"):
        seqs = run_to_end(eng, prompts, params)
    assert "verdict failed" in caplog.text
    assert [(s.output_ids, s.finish_reason) for s in seqs] == [(s.output_ids, "length") for s in plain]
    assert max(t for s in seqs for t in s.metrics.accept_lengths) > 1  # the rounds drafted


def test_a_failing_cost_measurement_fails_no_request(pair, caplog):
    """Timing forwards for auto's cost table only speeds its start: a measurement that raises
    ends the seeding, logged, and the requests decode on, exactly."""
    from flashtree.speculative.costs import CostTable

    class FirstRecordFails(CostTable):
        failures = 0

        def seed_verify(self, batch, tokens, secs):
            if not FirstRecordFails.failures:
                FirstRecordFails.failures += 1
                raise RuntimeError("injected failure in a cost measurement")
            super().seed_verify(batch, tokens, secs)

    tokenizer = Tokenizer(pair[0])
    prompts = [tokenizer.encode(p) for p in ("t1 t2", "t7 t8 t9")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = run_to_end(tiny_engine(pair, "ar"), prompts, params)
    eng = tiny_engine(pair, "ddtree")
    eng.adaptive.costs = costs = FirstRecordFails()
    with caplog.at_level(logging.ERROR, logger="flashtree.engine"):
        seqs = run_to_end(eng, prompts, params)
    assert FirstRecordFails.failures == 1 and "cost table failed" in caplog.text
    assert eng.seeder.done and costs.verify_s  # seeding ended; rounds measured instead
    assert [(s.output_ids, s.finish_reason) for s in seqs] == [(s.output_ids, "length") for s in plain]


def test_a_broken_engine_stops_and_health_says_so(pair):
    llm = LLM(model=pair[0], draft=pair[1], method="ar", max_batch_size=2)

    def broken(*a):
        raise RuntimeError("the device is gone")
    llm.engine.verifier = broken
    fatal = threading.Event()
    r = Running(create_app(llm, model_name="tiny", on_fatal=fatal.set))
    try:
        results = []
        threads = [threading.Thread(target=lambda: results.append(post(r.base, prompt="t1", max_tokens=4)))
                   for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(x.status_code in (500, 503) for x in results) and len(results) == 10
        assert fatal.wait(10)
        assert_error(httpx.get(r.base + "/health"), 503, code="engine_dead")
        assert_error(post(r.base, prompt="t1", max_tokens=4), 503, code="engine_dead")
    finally:
        r.stop()
    with pytest.raises(EngineFailure):  # the Python API raises it too
        llm.engine.verifier = broken
        llm.generate(["t1"] * 10, SamplingParams(max_tokens=3), use_tqdm=False)


def test_a_submission_racing_the_engine_death_is_refused_not_orphaned(pair):
    """A request that passed the app's liveness check while the loop was dying must still get an
    answer: whatever is in the inbox, or arrives after, is refused with EngineStopped."""
    import asyncio

    from flashtree.server.async_engine import AsyncEngine, EngineStopped, Submission
    from flashtree.server.metrics import ServerMetrics
    llm = LLM(model=pair[0], draft=pair[1], method="ar", max_batch_size=1)

    def broken(*a):
        raise RuntimeError("the device is gone")
    llm.engine.verifier = broken
    aeng = AsyncEngine(llm, ServerMetrics(), on_fatal=lambda: None, log_interval_s=None)
    aeng.start()

    async def many():
        subs = [Submission([[5, 6]], [SamplingParams(max_tokens=2)]) for _ in range(40)]
        return await asyncio.wait_for(asyncio.gather(*(aeng.submit(s) for s in subs), return_exceptions=True), 30)
    got = asyncio.run(many())  # every one answered: a channel (ended with "error") or EngineStopped
    assert all(not isinstance(g, BaseException) or isinstance(g, EngineStopped) for g in got)
    assert wait_for(lambda: not aeng.alive, 30) and aeng.failure
    with pytest.raises(EngineStopped, match="failed in a row"):  # after the death: refused at once
        asyncio.run(asyncio.wait_for(aeng.submit(Submission([[5, 6]], [SamplingParams(max_tokens=2)])), 5))


def test_engine_errors_name_their_field(pair):
    llm = LLM(model=pair[0], draft=pair[1])
    with pytest.raises(RequestError) as e:
        llm.engine.add_request([1, 2], SamplingParams(top_k=1000))
    assert e.value.param == "top_k"
    with pytest.raises(RequestError, match="block_size") as e:
        llm.engine.add_request([1, 2], SamplingParams(), method="ar", block_size=3)
    assert e.value.param == "speculative"


# -------------------------------------------------------------------- 4. body size, tokenising
def test_4_bodies_over_the_limit_are_413_and_health_stays_fast(server):
    big = {"model": "tiny", "prompt": "t1 " * 40_000, "max_tokens": 2}
    assert_error(httpx.post(server.base + "/v1/completions", json=big), 413, code="request_too_large")

    def chunks():  # no Content-Length: the limit applies while reading
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"t1 " * 1000
        yield b'"}'
    r = httpx.post(server.base + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413)
    assert idle(server)


def test_4_tokenising_runs_off_the_event_loop(pair):
    """A 6 MB prompt is tokenised while /health keeps answering (a server process of its own, so the
    test's client threads do not share its interpreter)."""
    port = free_port()
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--model", pair[0], "--draft", pair[1], "--port", str(port),
           "--max-body-size", str(32 * 2**20), "--served-model-name", "tiny", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert server_up(proc, base)
        slow = []

        def huge():
            t0 = time.perf_counter()
            slow.append(post(base, prompt="t1 " * 2_000_000, max_tokens=2, timeout=300))
            slow.append(time.perf_counter() - t0)
        t = threading.Thread(target=huge)
        t.start()
        lat = []
        while t.is_alive():
            t0 = time.perf_counter()
            assert httpx.get(base + "/health", timeout=60).status_code == 200
            lat.append(time.perf_counter() - t0)
            time.sleep(0.05)
        assert_error(slow[0], 400, "prompt", "context_length_exceeded")
        # before: /health waited for the whole tokenisation; now only for interpreter switches
        assert max(lat) < max(1.0, 0.3 * slow[1]), ([round(x, 3) for x in lat], slow[1])
    finally:
        proc.terminate()
        proc.wait(30)


def test_4_byte_level_prompts_are_measured_before_tokenising():
    tok = Tokenizer(BUNDLED_TOKENIZER)
    assert tok.max_bytes_per_token
    for text in ["def f(x):\n    return x\n" * 50, "é€😀" * 300, " " * 5000, "<|endoftext|>" * 10]:
        assert len(tok.encode(text, special=False)) >= tok.min_tokens(text) > 0


# -------------------------------------------------------------------- 5. disconnects
def test_5_non_streaming_disconnects_are_499_not_500(server, caplog):
    caplog.set_level(logging.ERROR)
    c500 = metric(server.base, "flashtree_rejected_requests_total", {"code": "500"})
    c499 = metric(server.base, "flashtree_rejected_requests_total", {"code": "499"})
    body = {"model": "tiny", "prompt": "t1 t2", "max_tokens": 400, "ignore_eos": True,
            "speculative": {"method": "ar"}}
    for timeout in (0.01, 0.03, 0.06, 0.1) * 3:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.base + "/v1/completions", json=body, timeout=timeout)
    assert idle(server)
    assert wait_for(lambda: metric(server.base, "flashtree_rejected_requests_total", {"code": "499"}) > c499)
    assert metric(server.base, "flashtree_rejected_requests_total", {"code": "500"}) == c500
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text


# -------------------------------------------------------------------- 6. bounds on work and waiting
def test_6_work_and_queue_are_bounded(pair):
    limits = ServerLimits(max_request_tokens=1000, max_queued_tokens=600, queue_timeout_s=0.1)
    r = serve(pair, limits, method="ar", batch=1)
    try:
        err = assert_error(post(r.base, prompt="t1", n=8, max_tokens=200), 400, "n", "request_too_large")
        assert "1000" in err["message"]
        # one long request holds the only slot; the next waits past the queue timeout
        body = {"prompt": "t1 t2", "max_tokens": 500, "ignore_eos": True, "temperature": 0}
        first = []
        t = threading.Thread(target=lambda: first.append(post(r.base, **body)))
        t.start()
        assert wait_for(lambda: metric(r.base, "flashtree_running_requests") == 1)
        late = post(r.base, prompt="t3", max_tokens=450, ignore_eos=True)
        assert_error(late, 503, code="queue_timeout")  # 500 tokens take far longer than 0.1 s
        assert int(late.headers["retry-after"]) >= 1
        # queued tokens: with one waiting request the next that would overflow is refused
        t2 = threading.Thread(target=lambda: post(r.base, **body))
        t2.start()
        t3 = threading.Thread(target=lambda: post(r.base, **body))
        t3.start()
        time.sleep(0.05)
        t.join(60)
        t2.join(60)
        t3.join(60)
        assert first[0].status_code == 200
        assert idle(r)
    finally:
        r.stop()


def test_6_queued_tokens_cap_is_503_with_retry_after(pair):
    r = serve(pair, ServerLimits(max_queued_tokens=600, queue_timeout_s=None), method="ar", batch=1)
    try:
        body = {"prompt": "t1 t2", "max_tokens": 500, "ignore_eos": True, "temperature": 0}
        threads = [threading.Thread(target=lambda: post(r.base, **body)) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        assert wait_for(lambda: metric(r.base, "flashtree_queue_depth") == 1, 10)
        late = post(r.base, **body)
        err = assert_error(late, 503, code="queue_full")
        assert "600" in err["message"] and int(late.headers["retry-after"]) >= 1
        for t in threads:
            t.join(60)
        assert idle(r)
    finally:
        r.stop()


# -------------------------------------------------------------------- 7. shutdown
def test_7_sigterm_drains_with_a_deadline_and_streams_end_cleanly(pair, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--model", pair[0], "--draft", pair[1], "--port", str(port),
           "--method", "ar", "--max-batch-size", "1", "--shutdown-timeout", "1.5", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FLASHTREE_API_KEY": "k3y"})
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "bearer k3y"}
    try:
        assert server_up(proc, base)
        assert httpx.get(base + "/metrics").status_code == 401  # the key comes from FLASHTREE_API_KEY
        ends = []

        def stream():
            body = {"prompt": "t1 t2", "max_tokens": 100_000 // 200, "ignore_eos": True, "stream": True}
            lines = []
            with httpx.stream("POST", base + "/v1/completions", json=body, headers=auth, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
            ends.append(lines)
        threads = [threading.Thread(target=stream) for _ in range(6)]
        for t in threads:
            t.start()
        assert wait_for(lambda: metric(base, "flashtree_queue_depth", headers=auth)
                        + metric(base, "flashtree_running_requests", headers=auth) == 6)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:  # admission is closed: refused or 503, never queued
            r = httpx.post(base + "/v1/completions", json={"prompt": "t1", "max_tokens": 2}, headers=auth)
            assert r.status_code == 503
        except httpx.TransportError:
            pass
        for t in threads:
            t.join(30)
        proc.wait(30)
        assert time.time() - t0 < 1.5 + 8, "shutdown took longer than the grace period"
        assert len(ends) == 6
        for lines in ends:
            assert lines[-1] == "data: [DONE]", lines[-3:]
            last = json.loads(lines[-2][6:])
            assert last["choices"][0]["finish_reason"] in ("length", "abort"), last
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# -------------------------------------------------------------------- 8. the smaller items
def test_8_only_json_bodies(server):
    for ctype, content in [("text/plain", '{"prompt": "t1"}'), ("application/x-www-form-urlencoded", "prompt=t1"),
                           ("multipart/form-data; boundary=x", "--x--")]:
        r = httpx.post(server.base + "/v1/completions", content=content, headers={"content-type": ctype})
        assert_error(r, 415, code="unsupported_media_type")
    r = httpx.post(server.base + "/v1/completions", content='{"prompt": "t1", "max_tokens": 2}',
                   headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_8_host_auth_and_docs(pair):
    r = serve(pair, api_key="s3cret", allowed_hosts=["localhost", "127.0.0.1", "::1"])
    try:
        ok = {"Authorization": "Bearer s3cret"}
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json", "/v1/models"):
            assert_error(httpx.get(r.base + path), 401, code="invalid_api_key")
            assert httpx.get(r.base + path, headers=ok).status_code == 200, path
        assert httpx.get(r.base + "/health").status_code == 200
        for scheme in ("bearer", "BEARER", "Bearer"):
            assert httpx.get(r.base + "/v1/models", headers={"Authorization": f"{scheme} s3cret"}).status_code == 200
        assert httpx.get(r.base + "/v1/models", headers={"Authorization": "Basic s3cret"}).status_code == 401
        evil = {**ok, "Host": "evil.example:8000"}
        assert_error(httpx.get(r.base + "/v1/models", headers=evil), 400, code="invalid_host")
        assert httpx.get(r.base + "/v1/models", headers={**ok, "Host": f"localhost:{r.port}"}).status_code == 200
        assert httpx.get(r.base + "/v1/models", headers={**ok, "Host": f"[::1]:{r.port}"}).status_code == 200
    finally:
        r.stop()


def test_8_errors_do_not_echo_huge_values_and_405_says_allow(server):
    r = post(server.base, prompt="t1", model="m" * 60_000)
    assert_error(r, 404, "model", "model_not_found")
    assert len(r.content) < 1000
    r = httpx.get(server.base + "/v1/completions")
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert "error" in r.json()


def test_8_header_and_body_timeouts_close_slow_connections(pair):
    from flashtree.server.app import HeaderTimeoutProtocol
    proto = type("P", (HeaderTimeoutProtocol,), {"header_timeout": 0.5})
    r = serve(pair, ServerLimits(body_timeout_s=0.5), http=proto)
    try:
        with socket.create_connection(("127.0.0.1", r.port)) as s:  # headers, then a body that stalls
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            s.settimeout(5)
            t0 = time.time()
            reply = b""
            while b"request_timeout" not in reply:  # headers and body may arrive in separate packets
                chunk = s.recv(1000)
                if not chunk:
                    break
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply, reply
            assert time.time() - t0 < 3
        with socket.create_connection(("127.0.0.1", r.port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # never finishes its headers
            s.settimeout(5)
            t0 = time.time()
            assert s.recv(100) == b""  # closed by the server
            assert time.time() - t0 < 3
        assert httpx.get(r.base + "/health").status_code == 200
    finally:
        r.stop()


def test_8_special_tokens_typed_by_a_user_are_text():
    tok = Tokenizer(BUNDLED_TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    text = "x = 1<|endoftext|>y"
    assert eos in tok.encode(text) and eos not in tok.encode(text, special=False)
    chat = tok.encode_chat([{"role": "system", "content": "s"}, {"role": "user", "content": text}])
    assert eos not in chat
    plain = [{"role": "user", "content": "def f():"}]
    assert tok.encode_chat(plain) == tok.encode(tok.apply_chat_template(plain))


def test_8_special_tokens_over_http_are_text():
    llm = LLM("tiny-code", method="ar")  # the bundled pair: a byte-level BPE with <|endoftext|>
    r = Running(create_app(llm, model_name="b"))
    try:
        body = {"model": "b", "prompt": "x = 1<|endoftext|>", "max_tokens": 2, "temperature": 0}
        res = httpx.post(r.base + "/v1/completions", json=body).json()
        assert res["usage"]["prompt_tokens"] == len(llm.tokenizer.encode("x = 1<|endoftext|>", special=False)) > 3
    finally:
        r.stop()


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="shutdown_timeout_s"):
        ServerLimits(shutdown_timeout_s=0)


def test_a_broken_engine_makes_serve_exit_1(pair, tmp_path):
    """`flashtree serve` exits non-zero when its engine breaks, so a supervisor restarts it."""
    port = free_port()
    script = tmp_path / "serve_broken.py"
    script.write_text(f"""
import sys
from flashtree import LLM
from flashtree.cli import build_parser
from flashtree.commands.serve import run
llm = LLM(model={pair[0]!r}, draft={pair[1]!r}, method="ar", max_batch_size=2)
def broken(*a):
    raise RuntimeError("the device is gone")
llm.engine.verifier = broken  # the engine's verify seam: every round now fails
args = build_parser()[0].parse_args(["serve", "--port", "{port}", "--method", "ar", "--log-level", "warning"])
sys.exit(run(args, llm=llm))
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert server_up(proc, base)
        codes = []
        for _ in range(12):
            try:
                codes.append(httpx.post(base + "/v1/completions", json={"prompt": "t1", "max_tokens": 3}).status_code)
            except httpx.TransportError:
                break
        assert codes and all(c in (500, 503) for c in codes), codes
        assert proc.wait(30) == 1
        assert "exiting with status 1" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
