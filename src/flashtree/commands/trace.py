"""`flashtree trace PROMPT --out trace.html`: generate once with the round log on and write a
self-contained page of every round's draft tree, accepted path, bonus token, τ and timings.

Argument handling and the run only; the page is rendered by `measure/trace_html.py`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .generate import (
    add_model_arguments,
    add_prompt_arguments,
    add_sampling_arguments,
    load_llm,
    resolve_prompt,
    sampling_params,
)


def add_arguments(p) -> None:
    add_prompt_arguments(p)
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.add_argument("--out", default="trace.html", help="HTML file to write (default trace.html)")


def run(args) -> int:
    from ..measure.trace_html import TraceMeta, render

    params = sampling_params(args)  # validate before loading anything
    llm = load_llm(args)
    prompt = resolve_prompt(llm, args)
    llm.engine.round_log = []
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    rounds, llm.engine.round_log = llm.engine.round_log, None
    meta = TraceMeta(prompt=prompt, output=out.text, method=args.method,
                     budget=llm.engine.limits.default_budget, topk=llm.engine.limits.default_topk,
                     block_size=llm.engine.limits.default_block_size,
                     temperature=params.temperature, model=str(llm.model_path),
                     draft=str(llm.draft_path) if llm.draft_path else None,
                     elapsed_s=out.metrics.elapsed_s, completion_tokens=out.metrics.completion_tokens)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(rounds, llm.tokenizer.decode, meta), encoding="utf-8")
    m = out.metrics
    print(f"wrote {path}: {m.rounds} rounds, {m.completion_tokens} tokens, mean accept length "
          f"{m.mean_accept_length:.2f}", file=sys.stderr)
    return 0
