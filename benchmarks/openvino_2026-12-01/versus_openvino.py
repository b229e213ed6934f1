"""Throughput against OpenVINO GenAI on this machine: the bundled pair, held-out prompts, C=1, T=0.

Issue 9 asks for flashtree's best speculative config above OpenVINO GenAI's own DFlash pipeline on
the same pair and prompts; a figure measured elsewhere (or at another time on a shared VM, whose
speed drifts by tens of percent) cannot answer that, so this runs both here, alternating: each pass
of each engine/config is its own process (so neither engine's thread pool spins beside the other's),
--repeats alternations, medians. Every pass generates --max-tokens tokens for each prompt, one
prompt at a time, and counts generated tokens over wall time around generate().

Not CI: OpenVINO GenAI and optimum-intel clash with the project's pins; install them beside the
venv and export the pair as `benchmarks/openvino_2026-12-01/check_openvino.py` says, then:

  PYTHONPATH=/tmp/ovpkgs .venv/bin/python benchmarks/openvino_2026-12-01/versus_openvino.py [--prompts 8] [--max-tokens 96]
      [--repeats 3] [--out benchmarks/openvino_2026-12-01/versus_openvino.json]

Run it on a quiet machine (`../shared/tools/quiet`).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLASHTREE = ("ar", "dflash", "ddtree@8", "hybrid@8")
OPENVINO = ("openvino", "openvino+dflash")


def one_pass(config: str, prompts: int, max_tokens: int, work: Path) -> dict:
    """One warm-up prompt, then every prompt once: generated tokens / seconds."""
    import numpy as np

    from flashtree.llm import BUNDLED_DRAFTER, BUNDLED_TARGET
    from flashtree.tokenizer import Tokenizer
    from flashtree.train.corpus import load_prompts
    ids = [Tokenizer(BUNDLED_TARGET).encode(t) for t in load_prompts()[:prompts]]
    if config.startswith("openvino"):
        import openvino as ov
        import openvino_genai as ov_genai
        f32 = {"INFERENCE_PRECISION_HINT": "f32"}
        kw = {}
        if config == "openvino+dflash":
            sched = ov_genai.SchedulerConfig()
            sched.enable_prefix_caching, sched.cache_size = False, 1
            kw = {"draft_model": ov_genai.draft_model(str(work / ("drafter-" + Path(BUNDLED_DRAFTER).resolve().name)),
                                                      "CPU", **f32), "scheduler_config": sched}
        pipe = ov_genai.LLMPipeline(str(work / "target"), "CPU", **kw, **f32)
        cfg = ov_genai.GenerationConfig()
        cfg.max_new_tokens, cfg.do_sample, cfg.ignore_eos, cfg.apply_chat_template = max_tokens, False, True, False
        if kw:
            cfg.num_assistant_tokens = 7

        def gen(p):
            return len(pipe.generate(ov.Tensor(np.asarray([p], dtype=np.int64)), cfg).tokens[0])
    else:
        from flashtree import LLM, SamplingParams
        method, _, budget = config.partition("@")
        llm = LLM("tiny-code", method=method, **({"budget": int(budget)} if budget else {}))
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

        def gen(p):
            return len(llm.generate([p], params, use_tqdm=False)[0].token_ids)
    gen(ids[0])
    n, t0 = 0, time.perf_counter()
    for p in ids:
        n += gen(p)
    return {"tokens": n, "seconds": time.perf_counter() - t0}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default="runs/openvino", help="the OpenVINO exports (benchmarks/openvino_2026-12-01/check_openvino.py)")
    p.add_argument("--configs", default=",".join(FLASHTREE + OPENVINO))
    p.add_argument("--out", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: one pass of one config
    a = p.parse_args()
    if a.one:
        print(json.dumps(one_pass(a.one, a.prompts, a.max_tokens, Path(a.work))))
        return 0
    configs = a.configs.split(",")
    runs = {c: [] for c in configs}
    for r in range(a.repeats):
        for c in configs:
            out = subprocess.run([sys.executable, __file__, "--one", c, "--prompts", str(a.prompts), "--max-tokens",
                                  str(a.max_tokens), "--work", a.work], capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            runs[c].append(res["tokens"] / res["seconds"])
            print(f"pass {r + 1}: {c:16s} {runs[c][-1]:7.0f} tok/s", flush=True)
    med = {c: statistics.median(v) for c, v in runs.items()}
    print(f"\nmedians of {a.repeats} alternating passes ({a.prompts} held-out prompts x {a.max_tokens} tokens, C=1, T=0):")
    for c in configs:
        print(f"  {c:16s} {med[c]:7.0f} tok/s")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"settings": {k: v for k, v in vars(a).items() if k != "one"},
                                           "passes_tok_s": runs, "median_tok_s": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
