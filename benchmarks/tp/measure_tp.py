"""Tensor parallelism on this CPU: TP=2 (gloo, one process per rank) against TP=1 (issue 13).

Two targets: a random ~100 M-parameter qwen3 (hidden 1024, 6 layers, 16 heads / 8 KV heads,
intermediate 4096, the bundled tokenizer's 4,096-token vocabulary), where each layer's GEMMs are
large against its two all-reduces, and the bundled 4 M target, where they are not. For each:
plain greedy decoding at C=1 and C=8 (tok/s) and one 512-token prefill (ms), with TP=1 and TP=2
alternating in the same process (each repeat loads neither anew), eager (TP>1 runs eager).
Medians of the repeats. Run on a quiet machine (`../shared/tools/quiet`).

Usage: python benchmarks/tp/measure_tp.py [--repeats 3] [--out benchmarks/tp/tp.json]
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from flashtree import LLM, SamplingParams
from flashtree.llm import BUNDLED_TARGET

p = argparse.ArgumentParser()
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--out", default=None)
a = p.parse_args()
root = Path(__file__).resolve().parents[2]
texts = [json.loads(line)["prompt"] for line in open(root / "src/flashtree/data/heldout_prompts.jsonl")][:8]


def random_target(path: Path) -> Path:
    import transformers
    cfg = transformers.Qwen3Config(vocab_size=4096, hidden_size=1024, intermediate_size=4096, num_hidden_layers=6,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                                   max_position_embeddings=2048, tie_word_embeddings=True, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).float()
    model.save_pretrained(path, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (BUNDLED_TARGET / f).is_file():
            shutil.copy(BUNDLED_TARGET / f, path / f)
    return path


def measure(llms: dict, tok) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    long = (tok.encode("\n".join(texts * 20)))[:512]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    runs: dict = {}
    for r in range(a.repeats + 1):  # repeat 0 warms up
        for tp, llm in llms.items():
            for c in (1, 8):
                t0, n = time.perf_counter(), 0
                for batch in ([[t] for t in texts[:c]] if c == 1 else [texts[:c]]):
                    n += sum(len(o.token_ids) for o in llm.generate(batch, params, use_tqdm=False, method="ar"))
                if r:
                    runs.setdefault(f"TP={tp} C={c} tok/s", []).append(n / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            llm.generate([long], one, use_tqdm=False, method="ar")
            if r:
                runs.setdefault(f"TP={tp} prefill 512 ms", []).append(1e3 * (time.perf_counter() - t0))
    out = {k: statistics.median(v) for k, v in runs.items()}
    for c in (1, 8):
        out[f"C={c} TP=2 / TP=1"] = out[f"TP=2 C={c} tok/s"] / out[f"TP=1 C={c} tok/s"]
    out["prefill TP=2 / TP=1 (time)"] = out["TP=2 prefill 512 ms"] / out["TP=1 prefill 512 ms"]
    return out


report = {"repeats": a.repeats, "threads": "TP=1: all cores in one process; TP=2: one core per rank"}
with tempfile.TemporaryDirectory() as d:
    for name, path in (("random 100M qwen3", random_target(Path(d) / "t100m")), ("bundled 4M", BUNDLED_TARGET)):
        two = LLM(model=path, method="ar", compile=False, tensor_parallel_size=2, enable_prefix_caching=False)
        cores = os.cpu_count() or 1
        one = LLM(model=path, method="ar", compile=False, enable_prefix_caching=False)

        class Threads:
            """Run TP=1 on every core, TP=2's rank 0 on its share (as LLM set it)."""
            def __init__(self, llm, n):
                self.llm, self.n = llm, n

            def generate(self, *args, **kw):
                torch.set_num_threads(self.n)
                return self.llm.generate(*args, **kw)
        res = measure({1: Threads(one, cores), 2: Threads(two, max(1, cores // 2))}, one.tokenizer)
        # the replicated LM head's share of a TP=1 decode step: the most a vocab-parallel head could save
        torch.set_num_threads(cores)
        h = torch.randn(1, one.target.config.hidden_size)
        with torch.inference_mode():
            times = []
            for _ in range(300):
                t0 = time.perf_counter()
                one.target.logits(h)
                times.append(time.perf_counter() - t0)
        res["lm_head ms (TP=1, one token)"] = 1e3 * statistics.median(times[50:])
        res["lm_head share of a C=1 step"] = res["lm_head ms (TP=1, one token)"] / (1e3 / res["TP=1 C=1 tok/s"])
        two.close()
        report[name] = {"params_millions": round(sum(p.numel() for p in one.target.parameters()) / 1e6, 1), **res}
        print(name, json.dumps({k: round(v, 2) for k, v in res.items()}), flush=True)
if a.out:
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
