"""`make demo`: the default model answers a chat (streamed), then the same chat with every method.

Loads `LLM()` once — SmolLM2-135M-Instruct with its drafter in dtype auto (the first load
converts the GGUF and compiles; later loads read the caches) — and prints, for plain decoding
and each drafting method, greedy: tokens, tok/s, tau (mean tokens committed per round) and
whether the text equals plain decoding's (it must: every method is lossless).

Usage: python scripts/demo.py [--model NAME] [--max-tokens N] [--chat TEXT]
"""
import argparse
import sys
import time

from flashtree import LLM, SamplingParams

p = argparse.ArgumentParser()
p.add_argument("--model", default=None, help="a model name, HF directory or .gguf (default: the default model)")
p.add_argument("--max-tokens", type=int, default=128)
p.add_argument("--chat", default="Write a Python function that checks whether a number is prime, with a docstring.")
a = p.parse_args()

t0 = time.perf_counter()
llm = LLM(a.model)
print(f"loaded {llm.model_name or a.model} ({llm.engine.dtype}, default method {llm.method}) "
      f"in {time.perf_counter() - t0:.1f} s\n", file=sys.stderr)
conv = [{"role": "user", "content": a.chat}]
greedy = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
print(f"user: {a.chat}\nassistant: ", end="")
for piece in llm.stream(llm.tokenizer.encode_chat(conv), greedy):
    print(piece, end="", flush=True)
print("\n")

methods = ["ar", "ngram"] + (["dflash", "ddtree", "hybrid"] if llm.engine.drafter is not None else [])
rows, plain = [], None
for method in methods:
    o = llm.chat(conv, greedy, use_tqdm=False, method=method)[0]
    m = o.metrics
    plain = plain if plain is not None else o.token_ids
    rows.append((method, m.completion_tokens, m.completion_tokens / max(m.elapsed_s, 1e-9), m.mean_accept_length,
                 o.token_ids == plain))
print(f"{'method':8} {'tokens':>6} {'tok/s':>7} {'tau':>5}  same text as ar")
for method, n, rate, tau, same in rows:
    print(f"{method:8} {n:6d} {rate:7.1f} {tau:5.2f}  {'yes' if same else 'NO'}")
sys.exit(0 if all(r[-1] for r in rows) else 1)
