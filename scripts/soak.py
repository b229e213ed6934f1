"""Soak and fuzz the OpenAI server the way a hostile crowd would, then check it is still whole.

Starts `flashtree serve` (a real process, loopback only) and, at the same time for --duration
seconds: --clients streaming clients with honest requests, clients that disconnect mid-stream or
give up on non-streaming requests, and a fuzzer sending at least --fuzz requests (hypothesis
strategies over the request schema: valid, adversarial and malformed fields, both endpoints, both
stream modes) plus the hand-written cases that once broke the server (issue 14). Then it checks:
no 5xx at all, every 4xx an OpenAI error body, every stream ending in [DONE], all KV slots free
and nothing queued when idle, greedy outputs unchanged after the storm, /health truthful. Prints
and writes (--out) the figures: requests, status codes, RSS of the server before and after.

    python scripts/soak.py                  # the full run (~3 minutes): benchmarks/soak.json
    python scripts/soak.py --short          # CI: ~30 s
Exit status 0 when every check holds.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROMPTS = ["def parse(line):\n", "import os\n", "class Stack:\n    def __init__(self):\n", "for i in range(10):\n"]
HUGE = [2**63, 2**63 - 1, 2**64, -2**63 - 1, 10**30]
TINY = [1e-40, 1e-46, 5e-324, 1e-300, 1e-5, float("inf")]
TIMEOUT = 120.0
HAND_WRITTEN = [  # (endpoint, body): the requests that broke the server before issue 14
    ("completions", {"prompt": "x", "n": 8, "top_k": 9223372036854775808, "temperature": 1, "max_tokens": 4}),
    ("completions", {"prompt": "x", "temperature": 1e-40, "max_tokens": 4}),
    ("completions", {"prompt": "x", "top_p": 1e-300, "max_tokens": 4}),
    ("completions", {"prompt": "x", "temperature": 1e-46, "seed": 1, "max_tokens": 4}),
    ("completions", {"prompt": "x", "seed": 2**64, "max_tokens": 2}),
    ("completions", {"prompt": "x", "n": 128, "max_tokens": 2047}),
    ("completions", {"prompt": "x", "model": "m" * 100_000}),
    ("completions", {"prompt": "x" * 3_000_000, "max_tokens": 2}),
    ("chat/completions", {"messages": [{"role": "user", "content": "<|endoftext|>" * 50}], "max_tokens": 4}),
    ("completions", {"prompt": [[1, 2], [3]], "n": 3, "max_tokens": 3, "temperature": 0.7, "top_p": 0.9}),
    ("completions", {"prompt": [4095, 4096], "max_tokens": 2}),
    ("completions", {"prompt": "x", "stop": [""], "max_tokens": 2}),
    ("completions", {"prompt": "x", "speculative": {"method": "dflash", "budget": 10**20}}),
]


def fuzz_bodies():
    """Request bodies: mostly plausible, often adversarial, sometimes malformed."""
    num = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(TINY),
                    st.floats(0, 2), st.integers(-3, 3), st.sampled_from(HUGE), st.text(max_size=3), st.none())
    count = st.one_of(st.integers(-2, 24), st.sampled_from(HUGE), st.floats(0, 10), st.none(), st.booleans())
    text = st.one_of(st.sampled_from(PROMPTS), st.text(max_size=200), st.just(""), st.just("<|endoftext|>"))
    ids = st.lists(st.one_of(st.integers(0, 4095), st.integers(-5, 5000), st.sampled_from(HUGE)), max_size=12)
    prompt = st.one_of(text, ids, st.lists(text, max_size=3), st.lists(ids, max_size=3), st.integers(), st.none())
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot", 3]),
                                     "content": st.one_of(text, st.lists(st.fixed_dictionaries(
                                         {"type": st.just("text"), "text": text}), max_size=2), st.none())})
    spec = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "method": st.sampled_from(["ar", "dflash", "ddtree", "medusa", None]), "budget": count,
        "block_size": count}))
    fields = {"temperature": num, "top_p": num, "top_k": count, "min_p": num, "n": st.one_of(st.integers(1, 3), count),
              "seed": count,
              "stop": st.one_of(st.none(), text, st.lists(text, max_size=3)), "ignore_eos": st.booleans(),
              "stop_token_ids": st.one_of(st.none(), ids), "speculative": spec, "stream": st.booleans(),
              "logprobs": st.one_of(st.none(), st.booleans()), "unknown_field": st.integers(),
              "model": st.one_of(st.just("flashtree"), st.text(max_size=5))}
    # max_tokens is always sent (absent means "up to the context", minutes per request on a CPU)
    max_tokens = st.one_of(st.integers(1, 24), st.integers(-2, 0), st.sampled_from(HUGE), st.floats(0, 10),
                           st.booleans(), st.text(max_size=2))
    completions = st.fixed_dictionaries({"prompt": prompt, "max_tokens": max_tokens}, optional=fields)
    chat = st.fixed_dictionaries({"messages": st.lists(message, max_size=3), "max_tokens": max_tokens},
                                 optional=fields)
    valid_fields = {"temperature": st.one_of(st.just(0), st.floats(1e-4, 2)), "top_p": st.floats(0.01, 1),
                    "top_k": st.integers(-1, 4096), "min_p": st.floats(0, 0.9), "n": st.integers(1, 3),
                    "seed": st.integers(-2**63, 2**64 - 1), "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
                    "ignore_eos": st.booleans(), "stream": st.booleans(), "stop_token_ids": st.lists(
                        st.integers(0, 4095), max_size=3),
                    "speculative": st.fixed_dictionaries({}, optional={
                        "method": st.sampled_from(["ar", "dflash", "ddtree"]), "block_size": st.integers(2, 8)})}
    valid_prompt = st.one_of(st.sampled_from(PROMPTS), st.text(min_size=1, max_size=100),
                             st.lists(st.integers(0, 4095), min_size=1, max_size=20))
    valid = st.fixed_dictionaries({"prompt": valid_prompt, "max_tokens": st.integers(1, 32)}, optional=valid_fields)
    return st.one_of(st.tuples(st.just("completions"), valid), st.tuples(st.just("completions"), valid),
                     st.tuples(st.just("completions"), completions), st.tuples(st.just("chat/completions"), chat))


class Tally:
    """Thread-safe counts of what came back, and the problems seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.status: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        self.problems: list[str] = []

    def add(self, kind: str, status: int | str, problem: str | None = None):
        with self.lock:
            self.status[str(status)] += 1
            self.kinds[kind] += 1
            if problem and len(self.problems) < 50:
                self.problems.append(f"{kind}: {problem}")


def check_response(r: httpx.Response, stream: bool) -> str | None:
    """None if the response is well formed, else what is wrong with it."""
    if r.status_code >= 500:
        return f"{r.status_code}: {r.text[:300]}"
    if r.status_code >= 400:
        try:
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
        except Exception:
            return f"{r.status_code} without an OpenAI error body: {r.text[:200]}"
        return None
    if stream:
        return None  # checked by the caller line by line
    body = r.json()
    return None if body.get("choices") else f"200 without choices: {r.text[:200]}"


def send(client: httpx.Client, endpoint: str, body, tally: Tally, kind: str) -> None:
    try:
        _send(client, endpoint, body, tally, kind)
    except httpx.HTTPError as e:  # a timeout or a dropped connection is the server's failure
        tally.add(kind, type(e).__name__, f"{type(e).__name__} for {json.dumps(body, allow_nan=True)[:300]}")


def _send(client: httpx.Client, endpoint: str, body, tally: Tally, kind: str) -> None:
    url = f"/v1/{endpoint}"
    stream = isinstance(body, dict) and body.get("stream") is True
    try:
        content = json.dumps(body, allow_nan=True).encode()
    except (TypeError, ValueError):
        content = str(body).encode()
    headers = {"content-type": "application/json"}
    if stream:
        with client.stream("POST", url, content=content, headers=headers) as r:
            if r.status_code != 200:
                r.read()
                tally.add(kind, r.status_code, check_response(r, False))
                return
            lines = [line for line in r.iter_lines() if line]
            problem = None if lines and lines[-1] == "data: [DONE]" else f"stream ended without [DONE]: {lines[-2:]}"
            if any('"error"' in line and '"server_error"' in line for line in lines):
                problem = f"server error in stream: {lines[-2:]}"
            tally.add(kind, 200, problem)
    else:
        r = client.post(url, content=content, headers=headers)
        tally.add(kind, r.status_code, check_response(r, False))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metric(base: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(base + "/metrics").text.splitlines():
        m = re.match(r"^(\w+)(\{[^}]*\})? ([-+\deE.naninf]+)$", line)
        if m and m.group(1) == name:
            total += float(m.group(3))
    return total


def greedy_outputs(base: str) -> list[str]:
    out = []
    for p in PROMPTS:
        for method in ("ar", "ddtree"):
            r = httpx.post(base + "/v1/completions", timeout=120, json={
                "prompt": p, "temperature": 0, "max_tokens": 48, "speculative": {"method": method}})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["text"])
    return out


def honest_client(base: str, stop_at: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        while time.time() < stop_at:
            body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 96), "stream": True,
                    "temperature": rng.choice([0, 0.7, 1.0]), "top_p": rng.choice([1.0, 0.9]),
                    "speculative": {"method": rng.choice(["ar", "dflash", "ddtree"])}}
            send(c, "completions", body, tally, "honest")


def disconnecting_client(base: str, stop_at: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    while time.time() < stop_at:
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": 400, "ignore_eos": True, "temperature": 0.8}
        if rng.random() < 0.5:  # leave a stream after a few chunks
            with httpx.Client(base_url=base, timeout=60) as c, c.stream("POST", "/v1/completions",
                                                                        json={**body, "stream": True}) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i >= rng.randint(1, 6):
                        break
            tally.add("disconnect", "dropped")
        else:  # give up on a non-streaming request
            try:
                httpx.post(base + "/v1/completions", json=body, timeout=rng.uniform(0.01, 0.3))
                tally.add("disconnect", "finished")
            except httpx.TimeoutException:
                tally.add("disconnect", "dropped")


def fuzz(base: str, n: int, tally: Tally, workers: int = 4) -> None:
    """n hypothesis-drawn requests (shared across `workers` threads) plus the hand-written cases."""
    with httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        for endpoint, body in HAND_WRITTEN:
            send(c, endpoint, body, tally, "hand-written")

    def worker(k: int):
        with httpx.Client(base_url=base, timeout=TIMEOUT) as c:
            @settings(max_examples=k, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck))
            @given(fuzz_bodies())
            def one(req):
                send(c, req[0], req[1], tally, "fuzz")
            one()
    per = -(-n // workers)
    threads = [threading.Thread(target=worker, args=(per,)) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="the CI size: 20 s, 4+2 clients, 300 fuzzed requests")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--disconnectors", type=int, default=4)
    ap.add_argument("--fuzz", type=int, default=1500)
    ap.add_argument("--model", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    ap.add_argument("--log", default=None, help="write the server's log here")
    ap.add_argument("--timeout", type=float, default=120.0, help="a request taking longer is a failure")
    args = ap.parse_args(argv)
    global TIMEOUT
    TIMEOUT = args.timeout
    if args.short:
        args.duration, args.clients, args.disconnectors, args.fuzz = 20.0, 4, 2, 300
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--port", str(port), "--max-batch-size", "8",
           "--log-level", "warning", "--queue-timeout", "60"]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--draft", args.draft] if args.draft else []
    env = {k: v for k, v in os.environ.items() if k != "FLASHTREE_API_KEY"}
    log = open(args.log, "w") if args.log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    checks: dict[str, bool] = {}
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                print(f"the server exited with {proc.returncode} (see --log)", file=sys.stderr)
                return 1
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                return 1
            time.sleep(0.2)
        before = greedy_outputs(base)
        rss_before = rss_kb(proc.pid)
        tally = Tally()
        t0 = time.time()
        stop_at = t0 + args.duration
        threads = [threading.Thread(target=honest_client, args=(base, stop_at, tally, i)) for i in range(args.clients)]
        threads += [threading.Thread(target=disconnecting_client, args=(base, stop_at, tally, 100 + i))
                    for i in range(args.disconnectors)]
        for t in threads:
            t.start()
        fuzz(base, args.fuzz, tally)
        for t in threads:
            t.join()
        storm_s = time.time() - t0
        idle = False
        for _ in range(100):
            idle = all(metric(base, m) == 0 for m in ("flashtree_kv_slots_used", "flashtree_running_requests",
                                                       "flashtree_queue_depth"))
            if idle:
                break
            time.sleep(0.1)
        after = greedy_outputs(base)
        health = httpx.get(base + "/health")
        rss_after = rss_kb(proc.pid)
        fives = sum(v for k, v in tally.status.items() if k.isdigit() and int(k) >= 500)
        checks = {"no_5xx": fives == 0, "well_formed": not tally.problems, "idle_slots_free": idle,
                  "greedy_unchanged": before == after, "health_ok": health.status_code == 200,
                  "fuzzed_enough": tally.kinds["fuzz"] >= args.fuzz, "server_alive": proc.poll() is None}
        report = {"command": "python scripts/soak.py" + (" --short" if args.short else ""),
                  "duration_s": round(storm_s, 1), "requests": sum(tally.kinds.values()),
                  "by_kind": dict(tally.kinds), "by_status": dict(sorted(tally.status.items())),
                  "rss_mb_before": round(rss_before / 1024, 1), "rss_mb_after": round(rss_after / 1024, 1),
                  "clients": args.clients, "disconnectors": args.disconnectors, "checks": checks,
                  "problems": tally.problems[:20], "load_avg_at_end": os.getloadavg()}
        print(json.dumps(report, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
