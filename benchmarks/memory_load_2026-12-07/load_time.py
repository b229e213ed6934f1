import time, sys
t0 = time.perf_counter()
from flashtree import LLM
llm = LLM(compile=False)
t1 = time.perf_counter()
import re
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) // 1024
print(f"LLM(compile=False) {t1 - t0:.2f} s, peak {hwm} MB")
