"""The OpenAI-compatible server, end to end: a real uvicorn server on a free loopback port serving a
tiny random target/drafter pair, driven by the official `openai` client (and httpx for raw HTTP)."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from flashtree import LLM, SamplingParams
from flashtree.server.app import create_app
from flashtree.server.async_engine import TextDelta
from helpers import make_drafter, make_hf_target, write_tokenizer
from serving import Running, metric, server_up, wait_for

CONTEXT = 512
VOCAB = 96
PROMPTS = ["t5 t17 t3 t60", "t1 t2 t3", "t44 t9 t12 t70 t71 t20", "t8", "t33 t34", "t90 t91 t92 t2 t2"]


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    target = make_hf_target(d / "target", max_position_embeddings=CONTEXT)
    write_tokenizer(target, VOCAB)
    draft = make_drafter(d / "draft", target, block_size=4)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def ref(pair):
    """Greedy single-request outputs of plain decoding, the reference for every greedy check."""
    llm = LLM(model=pair[0], draft=pair[1], method="ar", max_batch_size=1)
    cache = {}

    def text(prompt: str, max_tokens: int, chat: bool = False) -> str:
        key = (prompt, max_tokens, chat)
        if key not in cache:
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
            out = (llm.chat([{"role": "user", "content": prompt}], params) if chat
                   else llm.generate([prompt], params))[0]
            assert out.finish_reason == "length"
            cache[key] = out.text
        return cache[key]
    return text


@pytest.fixture(scope="module")
def offline(pair):
    """An LLM of its own on the served pair (the server's engine belongs to its loop thread)."""
    return LLM(model=pair[0], draft=pair[1], method="ddtree", max_batch_size=2)


@pytest.fixture(scope="module")
def server(pair):
    llm = LLM(model=pair[0], draft=pair[1], method="ddtree", max_batch_size=8)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    r = Running(create_app(llm, model_name="tiny"), sock)
    r.llm, r.state = llm, r.app.state.server
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)


# ------------------------------------------------------------------------------------ basics
def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(server.base + "/health").json()
    assert health["status"] == "ok" and health["kv_cache_tokens"] > 0 and health["kv_pages_used"] == 0
    assert health["graphs_compiling"] is False  # (eager: nothing compiles in the background)
    assert httpx.get(server.base + "/v1/models/tiny").json()["max_model_len"] == CONTEXT
    text = httpx.get(server.base + "/metrics").text
    for name in ("flashtree_spec_accepted_tokens_total", "flashtree_spec_rounds_total", "flashtree_queue_depth",
                 "flashtree_running_requests", "flashtree_kv_slots_used", "flashtree_time_to_first_token_seconds",
                 "flashtree_inter_token_latency_seconds", "flashtree_prompt_tokens_total", "flashtree_kv_pages_total",
                 "flashtree_kv_pages_used", "flashtree_prefix_cache_hit_tokens_total", "flashtree_preemptions_total"):
        assert name in text


@pytest.mark.parametrize("method", ["ar", "dflash", "ddtree"])
def test_greedy_chat_and_completion_equal_llm_generate(client, ref, method):
    spec = {"speculative": {"method": method}}
    for prompt in PROMPTS[:2]:
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=20, extra_body=spec)
        assert r.choices[0].message.content == ref(prompt, 20, chat=True)
        assert r.choices[0].finish_reason == "length" and r.object == "chat.completion"
        u = r.usage
        assert u.completion_tokens == 20 and u.total_tokens == u.prompt_tokens + 20
        spec_u = u.model_extra["spec"]
        hist = spec_u["accept_length_histogram"]
        assert sum(hist) == spec_u["rounds"] > 0
        assert spec_u["mean_accept_length"] == pytest.approx(sum((i + 1) * c for i, c in enumerate(hist)) / sum(hist))
        assert len(hist) == (1 if method == "ar" else 4)
        c = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=20, extra_body=spec)
        assert c.choices[0].text == ref(prompt, 20) and c.usage.completion_tokens == 20


def test_streaming_equals_non_streaming(client, ref):
    prompt = PROMPTS[2]
    chunks = list(client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref(prompt, 24)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert len([c for c in chunks if c.choices]) < 24  # speculation commits several tokens per chunk

    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                 temperature=0, max_tokens=24, n=2, stream=True))
    assert all(c.usage is None for c in chunks)
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert "".join(ch.delta.content or "" for ch in mine) == ref(prompt, 24, chat=True)
        assert mine[-1].finish_reason == "length"


@pytest.mark.parametrize("method", ["ar", "ddtree", "hybrid"])
def test_logprobs_through_the_openai_client_equal_the_python_api(offline, client, method):
    """chat (logprobs + top_logprobs) and completions (logprobs=k), streamed and not: the same
    entries as LLM.generate's for the same request, one per completion token."""
    prompt, spec = PROMPTS[0], {"speculative": {"method": method}}
    want = offline.chat([{"role": "user", "content": prompt}],
                           SamplingParams(temperature=0, max_tokens=16, logprobs=3), method=method)[0]
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], temperature=0,
                                       max_tokens=16, logprobs=True, top_logprobs=3, extra_body=spec)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == len(want.token_ids)
    decode = offline.tokenizer.decode
    for e, w in zip(content, want.logprobs):
        assert e.token == decode([w.token]) and e.logprob == pytest.approx(w.logprob, abs=1e-5)
        assert e.bytes == list(e.token.encode())
        assert [t.token for t in e.top_logprobs] == [decode([t]) for t, _ in w.top]
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                 temperature=0, max_tokens=16, logprobs=True, top_logprobs=3,
                                                 stream=True, extra_body=spec))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=16, extra_body=spec)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content

    c = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=12, logprobs=2, extra_body=spec)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset) and "".join(lp.tokens).startswith(c.choices[0].text[:1])
    chunks = list(client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=12, logprobs=2,
                                            stream=True, extra_body=spec))
    parts = [ch.choices[0].logprobs for ch in chunks if ch.choices and ch.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_penalties_and_logit_bias_through_the_openai_client(offline, client, method):
    """The client's typed parameters (and the extensions in extra_body) reach the engine: the
    reply equals LLM.generate's with the same processors, and differs from the unprocessed one."""
    prompt = PROMPTS[1]
    kw = dict(presence_penalty=0.6, frequency_penalty=0.4, logit_bias={"7": 3.0, "11": -5.0})
    extra = {"repetition_penalty": 1.2, "min_tokens": 4, "speculative": {"method": method}}
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=16, extra_body=extra, **kw)
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=16, presence_penalty=0.6,
                                                        frequency_penalty=0.4, logit_bias={7: 3.0, 11: -5.0},
                                                        repetition_penalty=1.2, min_tokens=4), method=method)[0]
    assert r.choices[0].text == want.text and r.usage.completion_tokens == len(want.token_ids)
    assert want.text != offline.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].text


def test_openapi_describes_the_generation_routes(server):
    doc = httpx.get(server.base + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', str(doc).replace("'", '"')))
    assert refs and refs <= set(schemas), refs - set(schemas)  # every reference resolves
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    props = schemas["ChatCompletionRequest"]["properties"]
    assert {"messages", "logprobs", "top_logprobs", "speculative", "max_completion_tokens"} <= set(props)
    assert "ChatLogprobs" in str(schemas["ChatChoice"]) and "CompletionLogprobs" in str(schemas["CompletionChoice"])
    assert set(doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]) == {
        "application/json", "text/event-stream"}


def test_sampling_n_and_seed(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0.9, top_p=0.95,
              max_tokens=16, n=2, seed=1234, extra_body={"top_k": 50, "min_p": 0.01})
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1] and a.usage.completion_tokens == 32
    assert texts == [c.message.content for c in b.choices]  # same seed, same samples
    assert texts[0] != texts[1]                              # choice i samples with seed + i
    # a streamed choice draws exactly what the non-streamed one drew
    s = client.chat.completions.create(**{**kw, "n": 1, "stream": True})
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == texts[0]
    c = client.completions.create(model="tiny", prompt=[PROMPTS[0], PROMPTS[1]], temperature=1.0, max_tokens=8, n=2)
    assert sorted(ch.index for ch in c.choices) == [0, 1, 2, 3] and c.usage.completion_tokens == 32


def test_stop_strings_and_stop_ids(client, ref):
    def late_stop(full):  # a stop string spanning two tokens (cut mid-word), first seen after token 3
        words = full.split(" ")
        for k in range(3, len(words) - 1):
            stop, at = words[k][1:] + " " + words[k + 1][:2], len(" ".join(words[:k])) + 2
            if full.find(stop) == at:
                return stop, at
    prompt, full, (stop, at) = next((p, ref(p, 30), late_stop(ref(p, 30))) for p in PROMPTS if late_stop(ref(p, 30)))
    words, expected = full.split(" "), full[:at]
    for method in ("ar", "ddtree"):
        body = dict(model="tiny", prompt=prompt, temperature=0, max_tokens=30, stop=[stop, "never"],
                    extra_body={"speculative": {"method": method}})
        r = client.completions.create(**body)
        assert (r.choices[0].text, r.choices[0].finish_reason) == (expected, "stop")
        streamed = list(client.completions.create(**body, stream=True))
        assert "".join(c.choices[0].text for c in streamed) == expected
        assert streamed[-1].choices[0].finish_reason == "stop"
    stop_id = int(words[5][1:])
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=30,
                                  extra_body={"stop_token_ids": [stop_id]})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == " ".join(words[:words.index(words[5])])


def test_one_log_line_per_finished_request(client, caplog):
    caplog.set_level(logging.INFO, logger="flashtree.server")
    client.completions.create(model="tiny", prompt=[[3, 4, 5]], max_tokens=5, temperature=0, n=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "flashtree.server" and "finished" in r.getMessage()]
    assert len(lines) == 2 and all("tok/s" in m and "mean accept length" in m for m in lines), lines


def test_text_delta_holds_back_broken_utf8_and_stop_prefixes():
    raw = "é€x".encode()
    d, out = TextDelta(None), ""
    for i in range(1, len(raw) + 1):
        text = raw[:i].decode("utf-8", errors="replace")
        piece = d.push(text, i == len(raw))
        assert "\ufffd" not in piece
        out += piece
    assert out == "é€x"
    d = TextDelta(["STOP"])
    assert d.push("abc ST", False) == "abc " and d.push("abc STO", False) == ""
    assert d.push("abc STx", False) == "STx" and d.push("abc STx", True) == ""


# ------------------------------------------------------------------------------------ concurrency
def test_sixteen_concurrent_streams(server, client, ref):
    rounds0 = metric(server.base, "flashtree_spec_rounds_total")
    carried0 = metric(server.base, "flashtree_spec_request_rounds_total")
    methods = ["ar", "dflash", "ddtree"]
    aclient = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(i):
        prompt, temp = PROMPTS[i % len(PROMPTS)], 0.0 if i % 2 == 0 else 0.8
        stream = await aclient.completions.create(
            model="tiny", prompt=prompt, temperature=temp, max_tokens=24, stream=True, seed=i,
            stream_options={"include_usage": True}, extra_body={"speculative": {"method": methods[i % 3]}})
        text, finish, usage = "", None, None
        async for c in stream:
            if c.choices:
                text += c.choices[0].text
                finish = c.choices[0].finish_reason or finish
            usage = c.usage or usage
        return prompt, temp, text, finish, usage

    async def all_():
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await aclient.close()

    for prompt, temp, text, finish, usage in asyncio.run(all_()):
        assert finish == "length" and usage.completion_tokens == 24
        assert len(text.split()) == 24 and all(re.fullmatch(r"t\d+", w) for w in text.split())
        if temp == 0:
            assert text == ref(prompt, 24)  # greedy under concurrency == single-request greedy
    rounds = metric(server.base, "flashtree_spec_rounds_total") - rounds0
    carried = metric(server.base, "flashtree_spec_request_rounds_total") - carried0
    assert rounds > 0 and carried / rounds > 2, (carried, rounds)  # rounds really carried several requests
    assert wait_for(lambda: metric(server.base, "flashtree_kv_slots_used") == 0)
    for method in methods:  # per-method acceptance metrics are consistent: accepted = sum(tau - 1)
        label = {"method": method}
        n = metric(server.base, "flashtree_spec_accept_length_count", label)
        assert n > 0 and n == metric(server.base, "flashtree_spec_request_rounds_total", label)
        accepted = metric(server.base, "flashtree_spec_accepted_tokens_total", label)
        assert accepted == metric(server.base, "flashtree_spec_accept_length_sum", label) - n
        assert accepted == metric(server.base, "flashtree_spec_accepted_by_position_total", label)


# ------------------------------------------------------------------------------------ errors
LONG = " ".join(["t7"] * (CONTEXT + 10))
BAD = [  # (path, body, status, param)
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [', 400, None),
    ("/v1/completions", b"[]", 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    ("/v1/completions", {"prompt": "t1", "max_tokens": "9"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "t1", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "t1", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "t1", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "t1", "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": LONG, "max_tokens": 1}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "t1", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "t1", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "t1", "logprobs": True}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "logprobs": "yes"}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "logprobs": True,
                              "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}], "tools": [{"type": "function"}]}, 400,
     "tools.0.function"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}],
                              "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/completions", {"prompt": "t1", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "t1", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": "t1", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "t1", "logit_bias": {"five": 10}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "t1", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "t1", "logit_bias": {"999": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "t1", "frobnicate": 1}, 400, "frobnicate"),
    ("/v1/completions", {"prompt": "t1", "speculative": {"method": "beam"}}, 400, "speculative.method"),
    ("/v1/completions", {"prompt": "t1", "speculative": {"budget": 0}}, 400, "speculative"),
    ("/v1/completions", {"prompt": "t1", "model": "gpt-9"}, 404, "model"),
]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client, ref):
    with httpx.Client(base_url=server.base, timeout=30) as h:
        for path, body, status, param in BAD:
            r = h.post(path, content=body, headers={"content-type": "application/json"}) if isinstance(body, bytes) else h.post(path, json={"model": "tiny", **body})
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
            assert err["param"] == param, (body, err)
        assert h.get("/v1/nope").status_code == 404 and "error" in h.get("/v1/nope").json()
    assert metric(server.base, "flashtree_rejected_requests_total", {"code": "400"}) >= len(BAD) - 1
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="t1", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="t1", max_tokens=2, temperature=-1)
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], temperature=0, max_tokens=8)
    assert r.choices[0].text == ref(PROMPTS[0], 8)


def test_queue_full_is_503(server):
    cfg = server.llm.engine.config
    old, cfg.max_queue = cfg.max_queue, 0
    try:
        r = httpx.post(server.base + "/v1/completions", json={"prompt": "t1", "max_tokens": 2})
    finally:
        cfg.max_queue = old
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    assert httpx.post(server.base + "/v1/completions", json={"prompt": "t1", "max_tokens": 2}).status_code == 200


def test_disconnect_frees_the_slot(server, monkeypatch):
    engine = server.llm.engine
    verify = engine.verifier

    def slow_verifier(*round_):  # (the engine's verify seam) keep requests running long enough to leave
        time.sleep(0.02)
        return verify(*round_)
    monkeypatch.setattr(engine, "verifier", slow_verifier)
    aborts = metric(server.base, "flashtree_requests_total", {"status": "abort"})
    body = {"prompt": "t1 t2", "max_tokens": 400, "temperature": 0, "stream": True,
            "speculative": {"method": "ar"}}
    with httpx.Client(timeout=30) as h, h.stream("POST", server.base + "/v1/completions", json=body) as r:
        lines = r.iter_lines()  # keep the iterator alive: dropping it closes the connection
        assert next(line for line in lines if line.startswith("data: {"))
        assert metric(server.base, "flashtree_kv_slots_used") == 1
        assert metric(server.base, "flashtree_running_requests") == 1
    assert wait_for(lambda: metric(server.base, "flashtree_kv_slots_used") == 0)
    assert wait_for(lambda: metric(server.base, "flashtree_requests_total", {"status": "abort"}) == aborts + 1)
    # a non-streaming client that gives up is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/v1/completions", json={**body, "stream": False}, timeout=0.5)
    assert wait_for(lambda: metric(server.base, "flashtree_requests_total", {"status": "abort"}) == aborts + 2)
    assert wait_for(lambda: metric(server.base, "flashtree_kv_slots_used") == 0)
    assert metric(server.base, "flashtree_running_requests") == 0


# ------------------------------------------------------------------------------------ the CLI
def test_cli_serve_with_api_key(pair, ref):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--model", pair[0], "--draft", pair[1], "--port", str(port),
           "--api-key", "sekret", "--method", "dflash", "--max-batch-size", "2", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FLASHTREE_API_KEY": ""})
    base = f"http://127.0.0.1:{port}"
    try:
        assert server_up(proc, base)
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sekret"}):
            r = httpx.post(base + "/v1/completions", json={"prompt": "t1"}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(base + "/v1/models").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=base + "/v1", api_key="sekret", max_retries=0)
        target_name = os.path.basename(pair[0])
        assert [m.id for m in c.models.list().data] == [target_name]
        r = c.completions.create(model=target_name, prompt=PROMPTS[3], temperature=0, max_tokens=12)
        assert r.choices[0].text == ref(PROMPTS[3], 12)
        assert r.usage.model_extra["spec"]["mean_accept_length"] >= 1
    finally:
        proc.terminate()
        proc.wait(30)


def test_cli_rejects_bad_options():
    from flashtree.cli import main
    assert main(["serve", "--max-queue", "0"]) == 2
