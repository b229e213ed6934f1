import re, gc, ctypes
def rss(tag):
    s = open("/proc/self/status").read()
    a = [int(re.search(k+r":\s+(\d+)", s).group(1)) // 1024 for k in ("VmRSS","RssAnon","RssFile","VmHWM")]
    ctypes.CDLL(None).malloc_trim(0)
    s = open("/proc/self/status").read()
    print(tag, a, "trimmed anon", int(re.search(r"RssAnon:\s+(\d+)", s).group(1)) // 1024)
import torch
from flashtree.llm import LLM
from flashtree.models.loader import load_target, load_drafter
from flashtree.models.registry import resolve
from flashtree.models import cpu_dense, quant
from flashtree.tokenizer import Tokenizer
from flashtree.grammar import Grammars
rss("imports")
cpu_dense.available(); quant.panels_ready(); rss("kernels loaded")
found = resolve(None, None); rss("resolve")
t = load_target(found.target, quant="auto"); rss("target")
t = t.fuse(); rss("fuse")
d = load_drafter(found.drafter, t); rss("drafter")
d = d.fuse(); rss("drafter fuse")
tk = Tokenizer(found.target); rss("tokenizer")
g = Grammars.from_tokenizer(tk.tk, t.config.vocab_size, tk.eos_token_ids); rss("grammars")
