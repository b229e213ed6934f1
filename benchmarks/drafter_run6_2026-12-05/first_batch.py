"""How long the first batch waits after LLM(precompile="single") on empty caches: LLM(), one chat,
then a batch of two chats (its graphs compile now), then the same batch again."""
import time

from flashtree import LLM, SamplingParams

t0 = time.perf_counter()
llm = LLM()
t1 = time.perf_counter()
print(f"LLM(): {t1 - t0:.1f} s", flush=True)
params = SamplingParams(temperature=0, max_tokens=32)
one = [{"role": "user", "content": "Name three prime numbers."}]
two = [one, [{"role": "user", "content": "Name two colours."}]]
llm.chat(one, params)
t2 = time.perf_counter()
print(f"one chat: {t2 - t1:.1f} s", flush=True)
llm.chat(two, params)
t3 = time.perf_counter()
print(f"first batch of two chats: {t3 - t2:.1f} s", flush=True)
llm.chat(two, params)
print(f"the same batch again: {time.perf_counter() - t3:.1f} s", flush=True)
