"""Serving throughput: per-request and total tok/s at several concurrencies for ar / dflash / ddtree.

Starts `flashtree serve` in a subprocess (or uses --url), then for each method x concurrency C runs
C streaming clients that each send --requests prompts back to back (the method is chosen per
request through the `speculative` extension, so one server serves all methods). Prints a table
and, as its last line, one JSON object with every row.

    .venv/bin/python scripts/bench_server.py                       # bundled pair
    .venv/bin/python scripts/bench_server.py --model T --draft D --concurrency 1 4 8
    .venv/bin/python scripts/bench_server.py --url http://127.0.0.1:8000 --api-key KEY
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

PROMPTS = Path(__file__).resolve().parents[1] / "src" / "flashtree" / "data" / "heldout_prompts.jsonl"


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "flashtree.cli", "serve", "--port", str(port), "--log-level", "warning",
           "--max-batch-size", str(max(args.concurrency)), "--device", args.device]
    for flag in ("model", "draft", "budget"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag}", str(getattr(args, flag))]
    if args.draft is None and args.model is not None:
        cmd += ["--method", "ar"]
    proc = subprocess.Popen(cmd)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(base + "/health").status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the server did not come up within 300 s")


async def one_request(client, model, prompt, method, args) -> dict:
    t0 = time.perf_counter()
    ttft, usage = None, None
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=args.temperature, stream=True,
        stream_options={"include_usage": True}, extra_body={"speculative": {"method": method}, "ignore_eos": True})
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].text:
            ttft = time.perf_counter() - t0
        usage = chunk.usage or usage
    dt = time.perf_counter() - t0
    spec = usage.model_extra["spec"]
    return {"latency_s": dt, "ttft_s": ttft, "tokens": usage.completion_tokens,
            "rounds": spec["rounds"], "accepted": spec["mean_accept_length"] * spec["rounds"]}


async def run_cell(base, api_key, model, prompts, method, conc, args) -> dict:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=api_key or "none", max_retries=0, timeout=3600)
    queue = list(prompts[:conc * args.requests])

    async def worker(w):
        out = []
        for i in range(w, len(queue), conc):
            out.append(await one_request(client, model, queue[i], method, args))
        return out

    t0 = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(worker(w) for w in range(conc))) for r in rs]
    wall = time.perf_counter() - t0
    await client.close()
    tokens = sum(r["tokens"] for r in results)
    rounds = sum(r["rounds"] for r in results)
    return {"method": method, "concurrency": conc, "requests": len(results), "tokens": tokens,
            "per_request_tok_s": sum(r["tokens"] / r["latency_s"] for r in results) / len(results),
            "total_tok_s": tokens / wall, "wall_s": wall,
            "mean_ttft_s": sum(r["ttft_s"] or 0 for r in results) / len(results),
            "mean_accept_length": sum(r["accepted"] for r in results) / max(rounds, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="an already running server (default: start one)")
    p.add_argument("--api-key", default=os.environ.get("FLASHTREE_API_KEY"))
    p.add_argument("--model", default=None, help="target dir (default: the bundled pair)")
    p.add_argument("--draft", default=None)
    p.add_argument("--budget", type=int, default=None, help="server default DDTree budget")
    p.add_argument("--device", default="auto")
    p.add_argument("--methods", nargs="+", default=["ar", "dflash", "ddtree"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--requests", type=int, default=2, help="requests per client per cell")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prompt-chars", type=int, default=400, help="keep the last N characters of each prompt")
    args = p.parse_args()

    prompts = [json.loads(line)["prompt"][-args.prompt_chars:] for line in PROMPTS.read_text().splitlines()]
    need = max(args.concurrency) * args.requests
    prompts = (prompts * (need // len(prompts) + 1))[:need]
    proc, base = (None, args.url.rstrip("/")) if args.url else start_server(args)
    try:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(base + "/v1/models", headers=headers).json()["data"][0]["id"]
        asyncio.run(run_cell(base, args.api_key, model, prompts, args.methods[0], 1, args))  # warm-up
        rows = [asyncio.run(run_cell(base, args.api_key, model, prompts, m, c, args))
                for m in args.methods for c in args.concurrency]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(f"{'method':8} {'conc':>4} {'reqs':>4} {'per-req tok/s':>13} {'total tok/s':>11} {'ttft s':>7} {'accept':>6}")
    for r in rows:
        print(f"{r['method']:8} {r['concurrency']:4d} {r['requests']:4d} {r['per_request_tok_s']:13.1f} "
              f"{r['total_tok_s']:11.1f} {r['mean_ttft_s']:7.3f} {r['mean_accept_length']:6.2f}")
    print(json.dumps({"max_tokens": args.max_tokens, "temperature": args.temperature, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
