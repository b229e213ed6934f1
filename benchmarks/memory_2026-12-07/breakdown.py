import os, re, collections
def rss():
    s = open("/proc/self/status").read()
    return int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) // 1024, int(re.search(r"VmHWM:\s+(\d+)", s).group(1)) // 1024
def top_maps(n=12):
    sizes = collections.Counter()
    name = None
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split()
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            sizes[name] += int(line.split()[1])
    for k, v in sizes.most_common(n):
        print(f"   {v//1024:6d} MB  {k}")
print("start", rss())
import torch
print("torch", rss())
from flashtree import LLM, SamplingParams
llm = LLM()
print("LLM()", rss(), llm.engine.blocks.capacity_tokens)
o = llm.chat([{"role": "user", "content": "What is a Python generator? Answer in two sentences."}], SamplingParams(temperature=0, max_tokens=64))[0]
print("chat", rss())
top_maps()
import ctypes
ctypes.CDLL("libc.so.6").malloc_trim(0)
print("after malloc_trim", rss())
import gc; gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
print("after gc+trim", rss())
kv = llm.engine
print([ (n, round(t.numel()*t.element_size()/2**20,1), str(t.device)) for n, t in vars(kv.runner).items() if hasattr(t, 'numel') and t.numel()*t.element_size() > 5*2**20])
