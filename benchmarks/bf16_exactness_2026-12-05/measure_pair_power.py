"""The power of the two-sample exactness check on the real pair (`compare_with_plain`): ddtree's
verify drawing at T x factor, for each factor, against plain sampling — where the check starts to
catch it. factor 1.0 is the product itself (it must pass).

    python benchmarks/bf16_exactness_2026-12-05/measure_pair_power.py --dtype bfloat16 --n 1500 --factors 1.0,1.1,1.2,1.3
"""
from __future__ import annotations

import argparse
import functools
import json
import time

from flashtree import LLM
from flashtree.measure.exactness import P_MIN, compare_with_plain, wrong_temperature


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--n", type=int, default=1500, help="runs per arm")
    ap.add_argument("--factors", default="1.0,1.1,1.2,1.3")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = []
    for f in (float(x) for x in args.factors.split(",")):
        llm = LLM("smollm2-135m-instruct", dtype=args.dtype, compile=False, method="ar", max_model_len=1024,
                  max_batch_size=64)
        prompt = llm.tokenizer.encode_chat([{"role": "user", "content": "Write a short poem about the sea."}])
        t0 = time.perf_counter()
        row = compare_with_plain(llm, n=args.n, prompts=[prompt], n_tokens=3, temperatures=(args.temperature,),
                                 budget=args.budget, top_p=args.top_p, methods=("ddtree",),
                                 patch=None if f == 1.0 else functools.partial(wrong_temperature, factor=f))[0]
        least = min(row["tests"], key=lambda t: t["p_value"])
        print(f"factor {f:.2f}: {'caught' if row['p_value'] <= P_MIN else 'passed'}  Bonferroni p {row['p_value']:.2e} "
              f"over {len(row['tests'])} tests (least: position {least['position']}, {least['count']} samples, "
              f"p {least['p_value']:.2e}); tau {row['mean_accept_length']:.2f}; {time.perf_counter() - t0:.0f} s",
              flush=True)
        out.append({"factor": f, **{k: v for k, v in row.items() if k != "prompt"}})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
