"""xgrammar against llguidance on this CPU: one JSON schema, the bundled target's 49,152-token
vocabulary (its tokenizer.json from the GGUF), the mask before each token of three valid documents
(the first of four passes dropped), and a tree walk (8 tokens fed and masked, then rolled back).

    python benchmarks/structured_2026-12-06/compare_grammar_libraries.py   # needs `pip install llguidance` besides xgrammar
"""
import json
import time

import llguidance
import llguidance.torch as llt
import numpy as np
import xgrammar as xgr
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from flashtree.models.registry import resolve

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
DOCS = [("Ada Lovelace", 36, ["math", "engines"], "London", "12345"),
        ("Alan Turing", 41, ["logic"], "Manchester", "54321"),
        ("Grace Hopper", 85, ["cobol", "navy", "compilers"], "Arlington", "22201")]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    path = str(resolve("smollm2-135m-instruct").target)  # the GGUF's converted config and tokenizer
    tk = Tokenizer.from_file(path + "/tokenizer.json")
    V = tk.get_vocab_size()
    seqs = [tk.encode(json.dumps({"name": n, "age": a, "tags": t, "address": {"city": c, "zip": z}}),
                      add_special_tokens=False).ids for n, a, t, c, z in DOCS]
    lt = llguidance.LLTokenizer(open(path + "/tokenizer.json").read())
    grm = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_object=tk), vocab_size=V)).compile_json_schema(json.dumps(SCHEMA))
    lbm, xbm = llt.allocate_token_bitmask(1, lt.vocab_size), xgr.allocate_token_bitmask(1, V)
    libs = {"llguidance": (lambda: llguidance.LLMatcher(lt, grm), lambda m: llt.fill_next_token_bitmask(m, lbm, 0),
                           lambda m, t: m.consume_token(t)),
            "xgrammar": (lambda: xgr.GrammarMatcher(compiled), lambda m: m.fill_next_token_bitmask(xbm, 0),
                         lambda m, t: m.accept_token(t))}
    for name, (start, mask, feed) in libs.items():
        times = []
        for rep in range(4):
            for ids in seqs:
                m = start()
                for t in ids:
                    dt = timed(lambda m=m, mask=mask: mask(m))
                    assert feed(m, t)
                    if rep:
                        times.append(dt * 1e6)
        m, walk = start(), []
        for _ in range(20):
            def node_walk(m=m, mask=mask, feed=feed):
                for t in seqs[0][:8]:
                    mask(m)
                    feed(m, t)
                m.rollback(8)
            walk.append(timed(node_walk) / 8 * 1e6)
        v = np.array(times)
        print(f"{name:11s} mask µs a token over {len(v)}: median {np.median(v):.1f} mean {v.mean():.1f} "
              f"p90 {np.percentile(v, 90):.1f} max {v.max():.1f}; tree walk µs a node {np.median(walk):.1f}")


if __name__ == "__main__":
    main()
