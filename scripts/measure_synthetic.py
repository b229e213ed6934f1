"""Plain decoding of one GGUF by flashtree and by llama.cpp, each in its own process: tok/s and peak RSS.

    python scripts/measure_synthetic.py FILE.gguf [--tokens 64] [--repeats 3] [--compile] [--out FILE.json]

Each engine loads the file, decodes a short prompt greedily for --tokens tokens (ignore_eos) once
to warm up, then --repeats times timed; tok/s is the median over those (decode only: the
prompt's prefill is timed apart). Peak RSS is the process's VmHWM after the last run, load time
from the start of the process to a loaded model. Made for scripts/synthetic_gguf.py's files
(random weights: speed and memory only). Run on a quiet machine (`../shared/tools/quiet`);
FLASHTREE_ISA applies to flashtree's process as usual (llama.cpp runs whatever its build has).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PROMPT = "def fibonacci(n):"

FLASHTREE = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
from flashtree import LLM, SamplingParams, cpu
path, n, repeats, compile_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
llm = LLM(model=path, method="ar", compile=compile_, max_batch_size=1, max_model_len=512)
load_s = time.perf_counter() - t0
ids = llm.tokenizer.encode(PROMPT)
sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
rates = []
for r in range(repeats + 1):
    out = llm.generate([ids], sp, use_tqdm=False)[0]
    m = out.metrics
    if r:
        rates.append((m.completion_tokens - 1) / (m.elapsed_s - m.ttft_s) if m.ttft_s else
                     m.completion_tokens / m.elapsed_s)
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0].split()[1]
print(json.dumps({"engine": "flashtree", "isa": cpu.isa(), "quant": llm.quant, "tok_s": statistics.median(rates),
                  "rates": rates, "peak_rss_mb": int(hwm) / 1024, "load_s": load_s, "compiled": compile_}))
""".replace("PROMPT", repr(PROMPT))

LLAMA = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
path, n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = Llama(model_path=path, n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)
load_s = time.perf_counter() - t0
ids = m.tokenize(PROMPT.encode())
rates = []
for r in range(repeats + 1):
    m.reset()
    t1 = time.perf_counter()
    gen = m.generate(ids, temp=0.0, top_k=1, reset=True)
    first = None
    for i, _ in enumerate(gen):
        if i == 0:
            first = time.perf_counter()
        if i + 1 >= n:
            break
    if r:
        rates.append((n - 1) / (time.perf_counter() - first))
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0].split()[1]
print(json.dumps({"engine": "llama.cpp", "tok_s": statistics.median(rates), "rates": rates,
                  "peak_rss_mb": int(hwm) / 1024, "load_s": load_s}))
""".replace("PROMPT", repr(PROMPT))


def run(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", action="store_true", help="flashtree's compiled graphs (default eager)")
    p.add_argument("--engines", default="flashtree,llama.cpp")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    rows = []
    for engine in a.engines.split(","):
        args = (str(a.file), str(a.tokens), str(a.repeats))
        row = run(FLASHTREE, *args, "1" if a.compile else "0") if engine == "flashtree" else run(LLAMA, *args)
        row.setdefault("engine", engine)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"file": a.file.name, "size_bytes": a.file.stat().st_size, "tokens": a.tokens,
                                     "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
