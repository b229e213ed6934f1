"""Two flashtree checkouts side by side on the same machine, prompts and settings (issue 9).

Each repeat runs one worker process per checkout (its own venv's Python), alternating, so machine
drift hits both alike; a worker loads the bundled pair with that checkout's defaults (compile
warm-up included, untimed), warms each configuration on one prompt, then times every held-out
prompt one at a time (C=1; greedy, or sampled with --temperature/--top-p, prompt i seeded with i so
both checkouts draw alike). Reports per-configuration median tok/s over repeats and the ratios
new/old. Configurations are `method` or `method@budget` (a number or auto); the checkout's defaults apply
otherwise. Run it on a quiet machine (`../shared/tools/quiet`).

Usage:
  python benchmarks/side_by_side/side_by_side.py --old /tmp/oldvenv/bin/python --new .venv/bin/python \
      --configs ar,dflash,ddtree@8,ddtree --new-extra compile=True --out benchmarks/side_by_side
  python benchmarks/side_by_side/side_by_side.py --old /tmp/oldvenv/bin/python --configs ar,ddtree@8 \
      --temperature 0.7 --top-p 0.95 --out benchmarks/side_by_side_t07
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time
from flashtree import LLM, SamplingParams
spec = json.loads(sys.argv[1])
prompts = [json.loads(l)["prompt"] for l in open(spec["prompts"])][spec["skip"]:spec["skip"] + spec["n"]]
llm = LLM(**spec["llm"])
T, top_p = spec["temperature"], spec["top_p"]
seeded = lambda i: SamplingParams(max_tokens=spec["max_tokens"], temperature=T, top_p=top_p, seed=i)  # noqa: E731
params = seeded(0)
out = {}
for label in spec["configs"]:
    method, _, budget = label.partition("@")
    kw = {"method": method, "budget": (int(budget) if budget.isdigit() else budget) if budget else None}
    try:
        llm.generate([prompts[0]], params, **kw)  # warm-up
    except ValueError as e:  # a method this checkout does not have
        out[label] = None
        print(f"{label}: {e}", file=sys.stderr)
        continue
    n, t0 = 0, time.perf_counter()
    for i, p in enumerate(prompts):
        n += len(llm.generate([p], seeded(i), **kw)[0].token_ids)
    out[label] = n / (time.perf_counter() - t0)
print("RESULT " + json.dumps(out))
"""


def worker(python: str, spec: dict) -> dict:
    r = subprocess.run([python, "-c", WORKER, json.dumps(spec)], capture_output=True, text=True, timeout=1800)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{python} failed:\n{r.stderr[-3000:]}")


def parse_extra(items: list[str]) -> dict:
    out = {}
    for item in items:
        k, v = item.split("=", 1)
        out[k] = {"True": True, "False": False}.get(v, v)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="python of the reference checkout's venv")
    p.add_argument("--new", default=sys.executable, help="python of this checkout's venv")
    p.add_argument("--configs", default="ar,dflash,ddtree")
    p.add_argument("--old-extra", nargs="*", default=[], help="LLM(...) keyword=value for the old checkout")
    p.add_argument("--new-extra", nargs="*", default=[], help="LLM(...) keyword=value for the new checkout")
    p.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "src/flashtree/data/heldout_prompts.jsonl"))
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--out", default=None, help="directory for side_by_side.json")
    a = p.parse_args()
    configs = a.configs.split(",")
    base = {"prompts": a.prompts, "n": a.num_prompts, "skip": a.skip, "max_tokens": a.max_tokens, "configs": configs,
            "temperature": a.temperature, "top_p": a.top_p}
    runs = {"old": [], "new": []}
    for r in range(a.repeats):
        for side, python, extra in (("old", a.old, a.old_extra), ("new", a.new, a.new_extra)):
            res = worker(python, {**base, "llm": parse_extra(extra)})
            runs[side].append(res)
            print(f"repeat {r + 1} {side}: " + ", ".join(f"{k} {v:.0f}" for k, v in res.items() if v), flush=True)
    med = {side: {c: (statistics.median(x[c] for x in rs) if rs[0][c] is not None else None) for c in configs}
           for side, rs in runs.items()}

    def f(x, spec):
        return "-" if x is None else format(x, spec)
    print(f"\n{'config':12s} {'old tok/s':>10s} {'new tok/s':>10s} {'new/old':>8s} {'new/new ar':>10s}")
    for c in configs:
        o, n = med["old"][c], med["new"][c]
        ratio = n / o if o and n else None
        print(f"{c:12s} {f(o, '10.0f'):>10s} {f(n, '10.0f'):>10s} {f(ratio, '8.2f'):>8s} "
              f"{f(n / med['new'][configs[0]] if n else None, '10.2f'):>10s}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "side_by_side.json").write_text(json.dumps(
            {"settings": {**base, "prompts": Path(a.prompts).name, "repeats": a.repeats, "old": a.old, "new": a.new,
                          "old_extra": a.old_extra, "new_extra": a.new_extra},
             "runs": runs, "median_tok_s": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
