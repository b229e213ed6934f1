"""Cross-object calls in one drafting round (issue 42): how many objects `Engine.step` talks to.

Traces one `engine.step()` of a ddtree round (tiny pair, eager, after a few warm rounds) with
`sys.setprofile` and counts calls from a method of one flashtree object to a method of another
(`self` differs; free functions and calls into torch/numpy are not counted). Prints the distinct
(caller, callee) method pairs and the total count. It uses only the public API, so it also runs
against an older checkout (PYTHONPATH=OLD/src) for a before/after comparison.

  python scripts/count_round_calls.py [--method ddtree] [--budget 8]
"""
import argparse
import sys
from collections import Counter


def owner(frame):
    s = frame.f_locals.get("self")
    mod = frame.f_globals.get("__name__", "")
    return s if s is not None and mod.startswith("flashtree") else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--method", default="ddtree")
    p.add_argument("--budget", default="8")
    a = p.parse_args()
    from flashtree import LLM, SamplingParams
    llm = LLM("tiny-code", method=a.method, budget=int(a.budget) if a.budget.isdigit() else a.budget,
              dtype="float32", device="cpu", compile=False, max_batch_size=2)
    eng = llm.engine
    for prompt in ("def add(a, b):", "class Stack:"):
        eng.add_request(llm.tokenizer.encode(prompt), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(4):  # prefill and a few rounds: the traced step is a steady drafting round
        eng.step()
    pairs: Counter = Counter()

    def prof(frame, event, arg):
        if event != "call":
            return
        callee, caller = owner(frame), frame.f_back and owner(frame.f_back)
        if callee is not None and caller is not None and callee is not caller:
            pairs[(f"{type(caller).__name__}.{frame.f_back.f_code.co_name}",
                   f"{type(callee).__name__}.{frame.f_code.co_name}")] += 1
    sys.setprofile(prof)
    eng.step()
    sys.setprofile(None)
    for (src, dst), n in sorted(pairs.items()):
        print(f"{n:4d}  {src} -> {dst}")
    print(f"{len(pairs)} distinct cross-object calls, {sum(pairs.values())} in all, "
          f"{len({d.split('.')[0] for _, d in pairs})} callee classes")


if __name__ == "__main__":
    main()
