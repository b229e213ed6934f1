"""Cross-object calls in one drafting round (issue 42): how many objects `Engine.step` talks to.

Traces one `engine.step()` of a ddtree round (tiny pair, eager, after a few warm rounds) with
`sys.setprofile` and counts calls from a method of one flashtree object to a method of another
(`self` differs; free functions and calls into torch/numpy are not counted). Prints the distinct
(caller, callee) method pairs and the total count, and the round's host reads: calls that bring a
tensor's values to the host (`item`, `tolist`, `numpy`, `__array__`, `cpu`, `__bool__`, `__int__`,
`__float__`, `__index__` of a tensor) — each is a device sync on a GPU — with their call sites. It uses only the public API, so it also runs
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
    reads: Counter = Counter()
    import torch
    host = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}

    def site(frame):
        return f"{frame.f_code.co_filename.split('src/')[-1]}:{frame.f_lineno} {frame.f_code.co_name}"

    def prof(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in host \
                and isinstance(getattr(arg, "__self__", None), torch.Tensor):
            reads[(arg.__name__, site(frame))] += 1
            return
        if event == "call" and frame.f_code.co_name == "__array__" and isinstance(frame.f_locals.get("self"),
                                                                                   torch.Tensor):
            reads[("__array__", site(frame.f_back))] += 1
            return
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
    for (what, where), n in sorted(reads.items(), key=lambda kv: kv[0][1]):
        print(f"{n:4d}  {what:10s} {where}")
    print(f"{sum(reads.values())} host reads of tensor values in the round, at {len(reads)} sites")


if __name__ == "__main__":
    main()
