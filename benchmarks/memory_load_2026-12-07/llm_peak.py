import re, sys, threading, time, traceback, gc, ctypes
def rss():
    s = open("/proc/self/status").read()
    return int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) // 1024
import torch
from flashtree import LLM, SamplingParams
main = threading.main_thread().ident
best = [0, None]; done = False
def sample():
    while not done:
        r = rss()
        if r > best[0]:
            best[0] = r; best[1] = traceback.extract_stack(sys._current_frames()[main])
        time.sleep(0.002)
th = threading.Thread(target=sample, daemon=True); th.start()
print("start", rss())
llm = LLM()
print("LLM()", rss(), "peak so far", best[0]); print("".join(traceback.format_list(best[1][-7:])))
best[0]=0
o = llm.chat([{"role": "user", "content": "What is a Python generator? Answer in two sentences."}], SamplingParams(temperature=0, max_tokens=64))[0]
done = True; th.join()
print("chat", rss(), "peak", best[0]); print("".join(traceback.format_list(best[1][-7:])))
