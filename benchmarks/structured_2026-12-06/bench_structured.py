"""Structured output on the real pair: tau with and without a JSON schema on the same chats, the
share of outputs that validate, and what the grammar costs per tree node.

Each chat asks for a JSON object of its own schema (schemas the drafter never saw); greedy. Without
the constraint the model writes what it likes (often prose around JSON); with it, the output is the
schema's JSON — once with the grammar's drafting (pruned, over-drafted, forced: the default) and
once with masks only (grammar_drafts=False: the same output, the drafter's trees as they come).
Runs are interleaved per chat: free, schema, schema masks-only, ... in one process.

    python benchmarks/structured_2026-12-06/bench_structured.py --out benchmarks/structured_2026-12-06/run.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jsonschema

from flashtree import LLM, SamplingParams, StructuredOutput
from flashtree.speculative.proposer import proposer_class

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
BOOK = {"type": "object", "properties": {"title": {"type": "string"}, "author": {"type": "string"},
                                         "year": {"type": "integer"},
                                         "genres": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["title", "author", "year", "genres"], "additionalProperties": False}
RECIPE = {"type": "object", "properties": {"dish": {"type": "string"}, "minutes": {"type": "integer"},
                                           "ingredients": {"type": "array", "items": {"type": "string"},
                                                           "maxItems": 5},
                                           "vegetarian": {"type": "boolean"}},
          "required": ["dish", "minutes", "ingredients", "vegetarian"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]},
                                            "temperature_c": {"type": "number"}},
           "required": ["city", "condition", "temperature_c"], "additionalProperties": False}
CHATS = [("Describe a fictional person as JSON with name, age and city.", PERSON),
         ("Give me a JSON record for the novel Pride and Prejudice: title, author, year, genres.", BOOK),
         ("Write a JSON object for a quick pasta recipe: dish, minutes, ingredients, vegetarian.", RECIPE),
         ("Report today's weather in Paris as JSON: city, condition, temperature_c.", WEATHER),
         ("Return a JSON object describing a software engineer named Ana who lives in Lisbon.", PERSON),
         ("JSON please: the book '1984' with its title, author, year and genres.", BOOK),
         ("As JSON, a vegetarian salad recipe with dish, minutes, ingredients and vegetarian.", RECIPE),
         ("Output JSON for snowy weather in Oslo at -4 degrees: city, condition, temperature_c.", WEATHER)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="dflash,ddtree")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out")
    ap.add_argument("--no-masks-only", action="store_true")
    a = ap.parse_args()
    llms = {"free": LLM("smollm2-135m-instruct", compile=False, max_batch_size=1)}
    llms["schema"] = llms["free"]
    if not a.no_masks_only:
        llms["schema masks-only"] = LLM("smollm2-135m-instruct", compile=False, max_batch_size=1, grammar_drafts=False)
    rows = []
    for method in a.methods.split(","):
        budget = a.budget if proposer_class(method).sized_by_budget else None
        for prompt, schema in CHATS:
            for arm, llm in llms.items():
                eng, constrained = llm.engine, arm != "free"
                so = StructuredOutput(json_schema=schema) if constrained else None
                params = SamplingParams(temperature=0, max_tokens=a.max_tokens, structured=so)
                eng.timings.clear()
                rows0, secs0 = eng.sampler.masked_rows, eng.sampler.mask_seconds
                t0 = time.perf_counter()
                o = llm.chat([{"role": "user", "content": prompt}], params, method=method, budget=budget)[0]
                wall = time.perf_counter() - t0
                valid = None
                if constrained and o.finish_reason == "stop":
                    try:
                        jsonschema.validate(json.loads(o.text), schema)
                        valid = True
                    except (ValueError, jsonschema.ValidationError):
                        valid = False
                masked = eng.sampler.masked_rows - rows0
                rows.append(dict(method=method, arm=arm, constrained=constrained, tau=o.metrics.mean_accept_length,
                                 tokens=len(o.token_ids), rounds=o.metrics.rounds, tok_s=len(o.token_ids) / wall,
                                 finish=o.finish_reason, valid=valid, masked_rows=masked,
                                 mask_us_per_row=(eng.sampler.mask_seconds - secs0) / masked * 1e6 if masked else None,
                                 prune_force_us_per_round=eng.timings.grammar / o.metrics.rounds * 1e6,
                                 text=o.text[:200]))
    summary = {}
    for method in a.methods.split(","):
        for arm in llms:
            constrained = arm != "free"
            rs = [r for r in rows if r["method"] == method and r["arm"] == arm]
            summary[f"{method} {arm}"] = dict(
                tau=sum(r["tau"] * r["rounds"] for r in rs) / sum(r["rounds"] for r in rs),
                median_tok_s=statistics.median(r["tok_s"] for r in rs),
                valid=None if not constrained else f"{sum(bool(r['valid']) for r in rs)}/{len(rs)}",
                mask_us_per_row=statistics.median(r["mask_us_per_row"] for r in rs) if constrained else None,
                prune_force_us_per_round=statistics.median(r["prune_force_us_per_round"] for r in rs)
                if constrained else None)
    for k, v in summary.items():
        print(f"{k:24s}", {n: (round(x, 2) if isinstance(x, float) else x) for n, x in v.items()})
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(host=platform.node(), summary=summary, rows=rows, args=vars(a),
                           dtype=str(llms["free"].engine.dtype)), f, indent=1)


if __name__ == "__main__":
    main()
