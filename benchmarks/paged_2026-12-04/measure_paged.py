"""The paged KV cache on the bundled pair (issue 12): memory, prefix-cache TTFT, chunked-prefill gaps.

Three measurements, each in one process (compiled runner as loaded by default), on a quiet
machine (`../shared/tools/quiet`):

1. memory: `LLM(max_batch_size=64, max_model_len=2048, kv_cache_tokens=16384)` — the KV bytes
   allocated against the unpaged size (64 full-length slots), and 64 concurrent greedy requests
   whose outputs must equal the same prompts run one at a time.
2. prefix cache: time to first token of a request with a ~1,500-token prefix seen before (warm,
   different suffix) against one with a fresh prefix (cold); interleaved pairs, medians.
3. chunked prefill: 4 plain (ar) streams decode; a ~1,800-token prompt with --method and
   max_tokens=1 arrives. The gaps between the
   streams' successive token deliveries (engine steps that emit), the largest while the prompt
   prefills and the next 60 steps against the median of 30 undisturbed steps before it, with the
   defaults (row budget + pacing), the row budget alone, and the whole prompt in one step.

Usage: python benchmarks/paged_2026-12-04/measure_paged.py [--out benchmarks/paged/paged.json] [--model NAME] [--parts chunked]
"""
import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from flashtree import LLM, SamplingParams
from flashtree.engine.engine_config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_PREFILL_STALL,
)

p = argparse.ArgumentParser()
p.add_argument("--out", default=None)
p.add_argument("--pairs", type=int, default=5, help="cold/warm TTFT pairs")
p.add_argument("--method", default="ddtree")
p.add_argument("--model", default="tiny-code")
p.add_argument("--stall", type=float, default=None, help="prefill_stall of the paced run (default: the engine's)")
p.add_argument("--parts", default="memory,prefix,chunked", help="which of the three measurements to run")
a = p.parse_args()
root = Path(__file__).resolve().parents[2]
texts = [json.loads(line)["prompt"] for line in open(root / "src/flashtree/data/heldout_prompts.jsonl")]
report: dict = {"machine": f"{platform.machine()}, {platform.processor() or 'cpu'}", "method": a.method}


def run_until_first(eng, ids, params):
    seq = eng.add_request(ids, params)
    t0 = time.perf_counter()
    while not seq.output_ids:
        eng.step()
    ttft = time.perf_counter() - t0
    while eng.has_work():
        eng.step()
    return ttft, seq


parts = set(a.parts.split(","))


# ------------------------------------------------------------------------ 1. memory
def memory() -> None:
    llm = LLM(a.model, method=a.method, max_batch_size=64, max_model_len=2048, kv_cache_tokens=16384)
    eng = llm.engine
    kv_bytes = eng.runner.cache.nbytes + sum(c.nbytes for c in (eng.runner.draft_cache, eng.runner.features) if c)
    per_token = kv_bytes / eng.runner.cache.k.shape[1]
    unpaged_tokens = 64 * eng.capacity
    tok = llm.tokenizer
    prompts = [tok.encode(t) for t in (texts * 8)[:64]]
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    t0 = time.perf_counter()
    seqs = [eng.add_request(ids, greedy) for ids in prompts]
    peak = 0
    while eng.has_work():
        eng.step()
        peak = max(peak, eng.blocks.used)
    t_c64 = time.perf_counter() - t0
    alone = []
    for ids in prompts:
        alone.append(run_until_first(eng, ids, greedy)[1].output_ids)
    report["memory"] = {
        "kv_cache_tokens": eng.blocks.capacity_tokens, "kv_mib": kv_bytes / 2**20,
        "unpaged_tokens": unpaged_tokens, "unpaged_mib": unpaged_tokens * per_token / 2**20,
        "concurrent_requests": 64, "completed": sum(s.finish_reason == "length" for s in seqs),
        "identical_to_c1": [s.output_ids for s in seqs] == alone, "peak_pages_used": peak,
        "pages_total": eng.blocks.pages_total, "preemptions": eng.stats.preemptions, "c64_seconds": t_c64}
    print("memory:", report["memory"], flush=True)
    del llm, eng

# ------------------------------------------------------------------------ 2. prefix cache TTFT
def prefix() -> None:
    llm = LLM(a.model, method=a.method, max_batch_size=4)
    eng, tok = llm.engine, llm.tokenizer
    corpus = tok.encode("\n".join(texts * 20))
    # a few tokens: the first round runs the drafter over the prompt, writing the drafter's context rows
    # (a drafter-based request reuses only pages whose drafter rows are written)
    one = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    rng = random.Random(0)
    cold, warm = [], []
    for i in range(a.pairs + 1):  # pair 0 warms up
        start = rng.randrange(len(corpus) - 1600)
        prefix = corpus[start:start + 1500]
        tc, _ = run_until_first(eng, prefix + tok.encode(f" question {i}a"), one)  # a prefix never seen: cold
        tw, _ = run_until_first(eng, prefix + tok.encode(f" question {i}b?"), one)  # same prefix: warm
        if i:
            cold.append(tc), warm.append(tw)
    report["prefix_cache"] = {"prefix_tokens": 1500, "pairs": a.pairs, "cold_ttft_ms": [1e3 * x for x in cold],
                              "warm_ttft_ms": [1e3 * x for x in warm],
                              "median_cold_ms": 1e3 * statistics.median(cold), "median_warm_ms": 1e3 * statistics.median(warm),
                              "warm_over_cold": statistics.median(warm) / statistics.median(cold)}
    print("prefix cache:", {k: v for k, v in report["prefix_cache"].items() if "median" in k or "over" in k}, flush=True)
    del llm, eng

# ------------------------------------------------------------------------ 3. chunked prefill gaps


def gaps(budget: int | None, stall: float | None) -> dict:
    llm = LLM(a.model, method=a.method, max_batch_size=5, max_num_batched_tokens=budget, prefill_stall=stall,
              enable_prefix_caching=False)
    eng, tok = llm.engine, llm.tokenizer
    corpus = tok.encode("\n".join(texts * 20))
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    streams = [eng.add_request(tok.encode(t), params, method="ar") for t in texts[:4]]  # plain streams
    def stream_gaps(steps: int, until=lambda: False) -> list[float]:
        last, out = time.perf_counter(), []
        for _ in range(steps):
            events = eng.step()
            now = time.perf_counter()
            if any(e.seq in streams and e.new_ids for e in events):
                out.append(now - last)
                last = now
            if until() or all(s.finished for s in streams):
                break
        return out

    stream_gaps(5)  # the streams are decoding
    alone = stream_gaps(30)  # their undisturbed rounds: the median the gaps are measured against
    longp = corpus[:1800]
    big = eng.add_request(longp, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))  # --method's
    t0 = time.perf_counter()
    out = stream_gaps(1000, until=lambda: bool(big.output_ids))
    ttft = time.perf_counter() - t0
    out += stream_gaps(60)  # past the cost seeding an auto request starts
    for s in streams + [big]:
        eng.abort(s)
    med = statistics.median(alone)
    return {"max_num_batched_tokens": eng.scheduler.max_num_batched_tokens, "prefill_stall": stall,
            "prompt_tokens": len(longp), "long_prompt_ttft_ms": 1e3 * ttft,
            "gaps_ms": [1e3 * g for g in out], "undisturbed_gaps_ms": [1e3 * g for g in alone],
            "median_gap_ms": 1e3 * med, "max_gap_ms": 1e3 * max(out), "max_over_median": max(out) / med}


def chunked() -> None:
    report["chunked_prefill"] = {"default": gaps(None, a.stall or DEFAULT_PREFILL_STALL)}
    if a.stall is None:
        report["chunked_prefill"].update(rows_only=gaps(None, None), one_step=gaps(4096, None))
    report["chunked_prefill"]["default_budget"] = DEFAULT_MAX_NUM_BATCHED_TOKENS
    for k, g in report["chunked_prefill"].items():
        if not isinstance(g, dict):
            continue
        print(f"chunked prefill ({k}, budget {g['max_num_batched_tokens']}, stall {g['prefill_stall']}): median gap "
              f"{g['median_gap_ms']:.1f} ms (undisturbed), max {g['max_gap_ms']:.1f} ms, ratio {g['max_over_median']:.2f}, "
              f"long prompt's TTFT {g['long_prompt_ttft_ms']:.0f} ms", flush=True)


for name, part in (("memory", memory), ("prefix", prefix), ("chunked", chunked)):
    if name in parts:
        part()
if a.out:
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
