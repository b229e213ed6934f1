"""The periodic decode-batch log line (`--log-interval`) and JSON logs (`--log-format json`)."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from flashtree import LLM
from flashtree.cli import main
from flashtree.engine.block_manager import BlockManager
from flashtree.engine.round import EngineStats
from flashtree.measure.exactness import target_drafts
from flashtree.server.app import create_app
from flashtree.server.logs import DecodeBatchLog, JsonFormatter, configure_logging
from serving import Running, free_port, wait_for

LINE = re.compile(r"^decode batch: running (\d+), waiting (\d+), kv used (\d+)%, accept len (\d+\.\d\d), "
                  r"gen throughput (\d+\.\d) tok/s, method ([\w+]+)$")


def parse(message: str) -> dict | None:
    m = LINE.match(message)
    if not m:
        return None
    return {"running": int(m[1]), "waiting": int(m[2]), "kv_used": int(m[3]), "accept_len": float(m[4]),
            "throughput": float(m[5]), "method": m[6]}


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def lines(self) -> list[tuple[float, dict]]:
        return [(r.created, p) for r in list(self.records) if (p := parse(r.getMessage()))]


@pytest.fixture
def recorder():
    logger = logging.getLogger("flashtree.server")
    rec, level = Recorder(), logger.level
    logger.addHandler(rec)
    logger.setLevel(logging.INFO)
    yield rec
    logger.removeHandler(rec)
    logger.setLevel(level)


# ------------------------------------------------------------------------------------ the window
def _engine(running=(), waiting=0, batch=4, max_len=100):
    """An engine's queues, its counters (a real `EngineStats`, which the log reads as it reads the
    engine's), and a real block manager whose pages hold the running sequences' rows (two-token
    pages: kv used = rows held / batch * max_len)."""
    blocks = BlockManager(batch * max_len // 2 + 1, 2, batch, max_len)
    for n in running:
        assert blocks.reserve(blocks.allocate(), n)
    return SimpleNamespace(running=[SimpleNamespace(length=n) for n in running], waiting=[None] * waiting,
                           config=SimpleNamespace(max_batch_size=batch), max_model_len=max_len, blocks=blocks,
                           stats=EngineStats())


def _rounds(eng, method: str, taus: list[int]) -> None:
    """One sequence of `method` committed these request-rounds (tau each, bonus included)."""
    for tau in taus:
        eng.stats.request_round(method, tau)


def test_line_format_and_values_over_the_interval(recorder):
    d = DecodeBatchLog(10.0, "ddtree")
    eng = _engine(running=(50, 98), waiting=1)
    _rounds(eng, "ar", [1, 1])  # counted before the window opened: not in any line
    eng.stats.generated_tokens += 2
    d.begin(eng, 100.0)
    _rounds(eng, "ddtree", [3, 4])
    _rounds(eng, "ddtree", [2])
    eng.stats.generated_tokens += 9
    assert d.tick(eng, 105.0) is None and not recorder.records  # the interval is not over
    d.begin(eng, 105.0)  # a window is open: begin() does not restart it
    _rounds(eng, "ddtree", [4, 3])
    eng.stats.generated_tokens += 7
    stats = d.tick(eng, 110.0)
    [(_, line)] = recorder.lines()
    assert recorder.records[0].getMessage() == ("decode batch: running 2, waiting 1, kv used 37%, accept len 3.20, "
                                                "gen throughput 1.6 tok/s, method ddtree")
    assert line["accept_len"] == 3.20 and stats["accept_len"] == pytest.approx(16 / 5)
    assert stats["gen_throughput"] == pytest.approx(16 / 10) and stats["kv_used_pct"] == pytest.approx(37.0)
    # the next interval starts from zero; an idle loop drops the partial window
    _rounds(eng, "ar", [1])
    eng.stats.generated_tokens += 1
    d.idle()
    d.begin(eng, 200.0)
    _rounds(eng, "ar", [1, 1])
    _rounds(eng, "dflash", [5])
    eng.stats.generated_tokens += 8
    d.tick(eng, 204.0)
    stats = d.tick(eng, 210.0)
    assert stats["accept_len"] == pytest.approx(7 / 3) and stats["gen_throughput"] == pytest.approx(0.8)
    assert stats["method"] == "ar+dflash" and len(recorder.lines()) == 2


def test_no_line_without_rounds_off_or_idle(recorder):
    for interval in (None, 0):
        d = DecodeBatchLog(interval, "ddtree")
        eng = _engine()
        d.begin(eng, 0.0)
        assert d.tick(eng, 1e6) is None
    d = DecodeBatchLog(1.0, "dflash")
    assert d.tick(_engine(), 1e6) is None  # no window was ever opened: nothing ran
    eng = _engine(waiting=3)
    d.begin(eng, 0.0)
    stats = d.tick(eng, 2.0)  # a window of prefills only
    assert stats["accept_len"] == 0.0 and stats["method"] == "dflash" and stats["waiting"] == 3
    assert len(recorder.lines()) == 1


# ------------------------------------------------------------------------------------ a real server
def test_server_logs_the_line_at_the_interval_with_the_workloads_accept_len(tiny_pair, recorder):
    """Drafts that are the target's own greedy chain, capped to a chain (topk=1): at T=0 every draft is
    accepted, so every round commits the whole block (4 tokens) and accept len must read 4.00. Float64:
    the drafts come from the uncached forward, and in float32 its rounding can break a near-tie the
    cached verify breaks the other way (a rejected draft, not a wrong line)."""
    from helpers import make_drafter
    draft = make_drafter(tiny_pair[1].parent / "draft4", tiny_pair[0], block_size=4)
    llm = LLM(model=tiny_pair[0], draft=draft, method="ddtree", budget=3, topk=1, dtype="float64", device="cpu")
    target_drafts(llm.target)(llm.engine)
    verify = llm.engine.verifier

    def slow_verifier(*round_):  # a few rounds per interval, on any machine
        time.sleep(0.02)
        return verify(*round_)
    llm.engine.verifier = slow_verifier
    interval = 0.4
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Running(create_app(llm, model_name="tiny", log_interval_s=interval), sock)
    try:
        max_tokens = 1 + 4 * 30  # the prefill's token, then 30 full rounds of 4 for each request

        def one(prompt):
            r = httpx.post(server.base + "/v1/completions", timeout=120, json={
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            out.append(r.json()["usage"])
        out: list = []
        threads = [threading.Thread(target=one, args=(p,)) for p in ([5, 6, 7], [9, 10, 11, 12])]
        t_start = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_end = time.time()
        assert [u["spec"]["accept_length_histogram"][3] for u in out] == [30, 30]  # every round took 4
        time.sleep(3 * interval)  # idle: no further lines
        lines = recorder.lines()
        assert len(lines) >= 2, [r.getMessage() for r in recorder.records]
        for _, line in lines:
            assert line["accept_len"] == 4.00 and line["method"] == "ddtree"
            # running and kv used are the state when the line is written: an interval whose work
            # finished inside it still reports its accept len and throughput, with running 0
            assert line["waiting"] == 0 and 0 <= line["running"] <= 2 and 0 <= line["kv_used"] <= 100
            assert line["throughput"] > 0
        assert max(line["running"] for _, line in lines) == 2
        stamps = [t for t, _ in lines]
        assert all(b - a >= interval * 0.9 for a, b in zip(stamps, stamps[1:]))  # one line per interval
        assert all(t_start <= t <= t_end + 0.1 for t in stamps)  # only while there is work
        # the interval's throughput: tokens generated in it / its length, so the lines add up to at most all tokens
        recs = [r for r in recorder.records if parse(r.getMessage())]
        counted = sum(r.fields["gen_throughput"] * r.fields["interval_s"] for r in recs)
        rounding = sum(r.fields["gen_throughput"] * 0.0005 for r in recs)  # interval_s is rounded to 1 ms
        assert 0 < counted <= 2 * max_tokens + rounding
    finally:
        server.stop()


# ------------------------------------------------------------------------------------ JSON logs
def test_json_formatter_writes_one_object_per_line():
    stream = io.StringIO()
    logger = logging.getLogger("flashtree.test_json")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        logger.warning("two\nlines", extra={"fields": {"accept_len": 3.5}})
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    a, b = map(json.loads, lines)
    assert a["message"] == "two\nlines" and a["level"] == "WARNING" and a["accept_len"] == 3.5
    assert a["logger"] == "flashtree.test_json" and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", a["time"])
    assert "RuntimeError: boom" in b["exc_info"]
    with pytest.raises(ValueError):
        configure_logging("info", "xml")


def test_cli_serve_json_logs_with_the_decode_batch_line(tiny_pair):
    port = free_port()
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
           "--port", str(port), "--log-format", "json", "--log-interval", "0.2", "--method", "ddtree", "--budget", "4", "--topk", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FLASHTREE_API_KEY": ""})
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            assert proc.poll() is None, proc.stderr.read()
            try:
                return httpx.get(base + "/health").status_code == 200
            except httpx.TransportError:
                return False
        assert wait_for(up, timeout=120)
        for _ in range(3):  # long enough for a few intervals on a busy machine
            r = httpx.post(base + "/v1/completions", timeout=120,
                           json={"prompt": "t1 t2", "max_tokens": 120, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["spec"]["topk"] == 2
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line is one object
    assert any(r["logger"].startswith("uvicorn") for r in records)  # uvicorn's own records too
    batch = [r for r in records if r.get("event") == "decode_batch"]
    assert batch, err
    for r in batch:
        assert parse(r["message"]) and r["method"] == "ddtree" and r["accept_len"] >= 1
        assert {"running", "waiting", "kv_used_pct", "gen_throughput", "interval_s"} <= set(r)


def test_cli_serve_rejects_a_negative_log_interval(capsys):
    assert main(["serve", "--log-interval", "-1"]) == 2
    assert "--log-interval" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--log-format", "xml"])
