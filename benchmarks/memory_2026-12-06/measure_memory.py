"""Resident memory of `LLM()` + one chat, `flashtree serve` (every process of it) and `make demo`.

Each runs as its own process tree; the tree's summed VmRSS (every descendant: compile helpers
included) is sampled every 0.1 s and its peak reported, with the RSS at the end. `serve` is asked
one chat completion once /health answers, then stopped with SIGTERM.

    python benchmarks/memory_2026-12-06/measure_memory.py --out benchmarks/memory_2026-12-06/memory.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
CHAT = {"role": "user", "content": "What is a Python generator? Answer in two sentences."}
LLM_CHILD = ("from flashtree import LLM, SamplingParams; llm = LLM(); "
             f"o = llm.chat([{CHAT!r}], SamplingParams(temperature=0, max_tokens=64))[0]; "
             "print(llm.method, llm.engine.blocks.capacity_tokens, len(o.token_ids))")


def tree_rss(pid: int) -> int:
    """Bytes resident in `pid` and every process below it."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        p = int(d.name)
        children.setdefault(int(fields["PPid"].strip()), []).append(p)
        rss[p] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


def watch(cmd: list[str], until=None, env=None) -> dict:
    """Run cmd; sample its tree's RSS until it exits (or `until(proc)` returns, then SIGTERM)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    peak, last, t0, extra = 0, 0, time.time(), None
    while proc.poll() is None:
        last = tree_rss(proc.pid)
        peak = max(peak, last)
        if until is not None and extra is None:
            extra = until(proc)
            if extra is not None:
                last = tree_rss(proc.pid)
                os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
    out = proc.stdout.read()
    return {"cmd": " ".join(cmd), "peak_mb": round(peak / 1e6), "end_mb": round(last / 1e6),
            "seconds": round(time.time() - t0, 1), "rc": proc.returncode, "answer": extra,
            "tail": out.strip().splitlines()[-3:]}


def serve_ready(port: int):
    state = {}

    def until(proc):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
        except OSError:
            return None
        if "t" not in state:
            state["t"] = time.time()
            body = json.dumps({"model": "flashtree", "messages": [CHAT], "max_tokens": 64, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            r = json.loads(urllib.request.urlopen(req, timeout=300).read())
            state["answer"] = r["usage"]
        return state["answer"] if time.time() - state["t"] > 5 else None  # a few samples after the answer
    return until


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--which", default="llm,serve,demo")
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args()
    report = {"when": time.strftime("%Y-%m-%d %H:%M")}
    which = a.which.split(",")
    if "llm" in which:
        report["llm"] = watch([PY, "-c", LLM_CHILD])
    if "serve" in which:
        report["serve"] = watch([str(Path(PY).with_name("flashtree")), "serve", "--port", str(a.port)],
                                until=serve_ready(a.port))
    if "demo" in which:
        report["demo"] = watch(["make", "demo"])
    print(json.dumps(report, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
