"""`flashtree bench`: methods x budgets x topks x temperatures x concurrency on a prompt set, plus
peers on the same weights (transformers; llama.cpp for a GGUF model, with the `peers` extra);
prints a table — tok/s, tau and whether the output is exact, per temperature — writes
bench.json, report.md and PNGs; exit code 1 if a cell is not exact.

Argument handling only; measurement, the bound and the plots live in `measure/bench.py`, the peers
in `measure/peers.py`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..engine.engine_config import DEFAULT_MAX_BATCH_SIZE
from ..errors import UserError
from ..models.quant import describe as describe_quant
from ..speculative.proposer import METHODS, needs_drafter
from .generate import (
    add_model_arguments,
    add_sampling_arguments,
    load_llm,
    sampling_params,
)

DEFAULT_BUDGETS = [4, 8, 16, 32, "auto"]


def _list(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"expected a comma-separated list of {kind.__name__}, got '{text}'") from None
    parse.__name__ = f"list of {kind.__name__}"
    return parse


def parse_budgets(text: str) -> list[int | str]:
    """Comma list of tree budgets: integers and/or 'auto'."""
    try:
        return [x.strip().lower() if x.strip().lower() == "auto" else int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers and/or 'auto', got '{text}'") \
            from None


def _topks(text: str) -> list[int | None]:
    """Comma list of branching caps; 'none' = no cap."""
    try:
        return [None if x.strip().lower() == "none" else int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers or 'none', got '{text}'") from None


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_sampling_arguments(p)
    # --method/--budget/--temperature become the single-value forms of the lists below
    p.set_defaults(method=None, temperature=None)
    p.add_argument("--prompts", default=None, help="JSONL with a 'prompt' (text) or 'messages' (a chat: the "
                   "chat template applied) field per line (default: the bundled held-out stdlib prompts; "
                   "'chats': the bundled held-out chat requests; 'user': the user-like held-out chats, other languages' code, "
                   "everyday questions and second turns)")
    p.add_argument("--num-prompts", type=int, default=8, help="use the first N prompts (default 8)")
    p.add_argument("--methods", type=_list(str), default=None,
                   help=f"comma list of {','.join(METHODS)} (default: all; ar is always run as the baseline)")
    p.add_argument("--budgets", type=parse_budgets, default=None,
                   help=f"comma list of DDTree budgets (default: --budget, else {','.join(map(str, DEFAULT_BUDGETS))})")
    p.add_argument("--topks", type=_topks, default=None,
                   help="comma list of DDTree branching caps, 'none' = no cap, each run with every budget it fits "
                        "(default: --topk, else none); e.g. none,1 compares full trees with chains")
    p.add_argument("--temperatures", type=_list(float), default=None,
                   help="comma list (default: --temperature, else 0,1)")
    p.add_argument("--exact-samples", type=int, default=20000,
                   help="runs of each T>0 chi-square exactness cell (default 20000; 0 = no exactness column)")
    p.add_argument("--concurrency", type=_list(int), default=[1],
                   help="comma list of sequences decoded together (default 1)")
    p.add_argument("--compile-modes", type=_list(str), default=None,
                   help="compare runner modes side by side, interleaved: eager,compiled (loads compiled; "
                        "default: the one mode --compile/--no-compile selects)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per cell; tok/s is their median")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes per cell first")
    p.add_argument("--slice-prompts", type=int, default=2,
                   help="prompts per slice: each repeat runs every configuration on one slice of the prompt "
                        "set before the next, so the configurations compared share the machine's state "
                        "(default 2; at least the concurrency)")
    p.add_argument("--peers", type=_list(str), nargs="?", const=None, default=None, metavar="LIST",
                   help="also time these engines on the same weights, batch 1: a comma list of hf (transformers "
                        "generate and its prompt lookup) and llama.cpp (llama-cpp-python on a GGUF model's file and "
                        "its unquantized rewrites, plain and prompt lookup; needs the peers extra) "
                        "(default, or --peers alone: every one that applies)")
    p.add_argument("--no-peers", dest="peers", action="store_const", const=[], help="time no peers")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens of the hf peer")
    p.add_argument("--llama-cpp-weights", type=_list(str), default=["f32", "bf16", "file"],
                   help="the GGUF files the llama.cpp peer times: a comma list of f32, bf16, f16 (the model's "
                        "weights rewritten unquantized, once, into the cache) and file (the GGUF as it is) "
                        "(default f32,bf16,file)")
    p.add_argument("--llama-cpp-lookup-tokens", type=int, default=2,
                   help="num_pred_tokens of the llama.cpp peer's prompt lookup (default 2, its advice for CPUs)")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly --max-tokens per prompt, for every method and peer (default on)")
    p.add_argument("--out", default="bench-results", help="output folder for bench.json, report.md, PNGs")


def _named_with_drafter(model: str) -> bool:
    """A model name whose registry entry brings its own drafter (e.g. smollm2-135m-instruct)."""
    from ..models.registry import MODELS
    return model in MODELS and MODELS[model].has_drafter()


def plan_from_args(args):
    from ..measure.bench import BenchPlan
    methods = args.methods or ([args.method] if args.method else list(METHODS))
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UserError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    drafted = [m for m in methods if needs_drafter(m)]
    if args.model is not None and args.draft is None and drafted and not _named_with_drafter(args.model):
        free = ",".join(m for m in METHODS if not needs_drafter(m))
        raise UserError(f"{'/'.join(drafted)} need a drafter: pass --draft DIR, or --methods {free}")
    budgets = args.budgets or ([args.budget] if args.budget is not None else DEFAULT_BUDGETS)
    temps = args.temperatures or ([args.temperature] if args.temperature is not None else [0.0, 1.0])
    topks = args.topks or [args.topk]
    if args.exact_samples < 0:
        raise UserError(f"--exact-samples must be >= 0, got {args.exact_samples}")
    modes = None
    if args.compile_modes:
        names = {"eager": False, "compiled": True}
        bad = [m for m in args.compile_modes if m not in names]
        if bad:
            raise UserError(f"--compile-modes takes eager and/or compiled, got {', '.join(bad)}")
        modes = [names[m] for m in dict.fromkeys(args.compile_modes)]
        if True in modes:
            if args.compile is False:
                raise UserError("--compile-modes with compiled needs the compiled runner: drop --no-compile")
            args.compile = True  # loaded compiled; eager passes switch the runner's forwards
    return BenchPlan(methods=methods, budgets=budgets, temperatures=temps, concurrency=args.concurrency,
                     repeats=args.repeats, warmup=args.warmup, topks=topks, exact_samples=args.exact_samples,
                     compile_modes=modes, slice_prompts=args.slice_prompts)


def portable_command(argv: list[str]) -> str:
    """The command line as typed, with absolute paths made portable (no machine paths in reports)."""
    from ..measure.bench import portable_path
    def one(a: str) -> str:
        flag, eq, value = a.partition("=")
        if eq and flag.startswith("--") and os.path.isabs(value):
            return f"{flag}={portable_path(value)}"
        return portable_path(a) if os.path.isabs(a) else a
    return shlex.join(["flashtree"] + [one(a) for a in argv])


def run(args, patch=None) -> int:
    """The bench command; `patch(engine)` runs on every engine it measures (tests: a wrong verifier)."""
    from tqdm import tqdm

    from ..measure import bench as bm
    from ..measure import bench_report
    from ..measure import peers as pe
    from ..models.registry import resolve
    from ..train.corpus import PROMPTS_FILE, load_prompts
    from . import env

    plan = plan_from_args(args)
    llama_cpp = pe.LlamaCppOptions(weights=tuple(args.llama_cpp_weights), lookup_tokens=args.llama_cpp_lookup_tokens)
    choice = pe.choose_peers(args.peers, resolve(args.model, args.draft).target)
    needed = ["matplotlib"] + (["transformers"] if "hf" in choice.engines else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:  # fail before measuring, not after
        raise UserError(f"bench needs {' and '.join(missing)} (pip install 'flashtree[dev]')"
                         + ("; or run with --no-peers" if missing == ["transformers"] else ""))
    for line in choice.skipped:
        print(f"flashtree bench: {line}", file=sys.stderr)
    args.temperature = plan.temperatures[0]
    base = replace(sampling_params(args), ignore_eos=args.ignore_eos)  # validated before loading
    if args.num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.prompts in ("chats", "user"):
        from ..train.chats import HELDOUT_CHATS, HELDOUT_USER_CHATS
        args.prompts = str(HELDOUT_CHATS if args.prompts == "chats" else HELDOUT_USER_CHATS)
    if args.prompts is not None and not Path(args.prompts).is_file():
        raise UserError(f"{args.prompts}: prompt file not found (JSONL with a 'prompt' field per line)")
    prompts = load_prompts(args.prompts)[:args.num_prompts]
    if not prompts:
        raise UserError(f"{args.prompts or PROMPTS_FILE}: no prompts")
    # loaded with a method the plan runs (a drafter one where it has any: the drafter is then required)
    args.method = next((m for m in plan.methods if needs_drafter(m)), plan.methods[0])
    args.topk = None  # caps are per pass (--topks)
    if getattr(args, "draft_len", None) is None:  # ngram copies as many tokens as the prompt-lookup peer
        args.draft_len = args.prompt_lookup_tokens
    # the engine users get (its default slots, each pass limited to its concurrency): at C=1 on one
    # slot auto's cost table could never be seeded (the seeder times forwards on free slots)
    llm = load_llm(args, precompile="all", max_batch_size=max(plan.concurrency + [DEFAULT_MAX_BATCH_SIZE]))
    prompt_ids = [llm.tokenizer.encode_chat(p) if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts]
    peers = pe.load_peers(choice, llm, prompt_ids, base.max_tokens, args.prompt_lookup_tokens, llama_cpp)

    load_before = bm.machine_load()
    if load_before["load_1m"] is not None and load_before["load_1m"] > 0.25 * (load_before["cpus"] or 1):
        print(f"flashtree bench: warning: 1-minute load average {load_before['load_1m']} on "
              f"{load_before['cpus']} CPUs: other work will skew the numbers", file=sys.stderr)
    with tqdm(total=plan.passes(sum(len(p.runs) for p in peers)), desc="bench", unit="pass", file=sys.stderr) as bar:
        results = bm.run_bench(llm, prompt_ids, base, plan, peers, progress=bar, patch=patch)
    path = env.cpu_path()
    meta = {
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"), "command": portable_command(sys.argv[1:]),
        "model": bm.portable_path(llm.model_path),
        "draft": bm.portable_path(llm.draft_path) if llm.draft_path else None,
        "block_size": llm.engine.limits.default_block_size, "device": str(llm.engine.device),
        "dtype": str(llm.engine.dtype).removeprefix("torch."),
        "kv_dtype": str(llm.engine.kv_dtype).removeprefix("torch."), "quant": llm.quant,
        "drafter_quant": describe_quant(llm.drafter) if llm.drafter is not None else None,
        "isa": path["isa"], "threads": llm.engine.threads.most, "cpu_path": path,
        "prompts": bm.portable_path(args.prompts or PROMPTS_FILE),
        "num_prompts": len(prompts), "prompt_tokens": [len(p) for p in prompt_ids],
        "max_tokens": base.max_tokens, "ignore_eos": base.ignore_eos, "top_k": base.top_k,
        "top_p": base.top_p, "min_p": base.min_p, "repeats": plan.repeats, "warmup": plan.warmup,
        "slice_prompts": plan.slice_prompts,
        "topks": plan.topks, "exact_samples": plan.exact_samples, "compile_modes": plan.compile_modes,
        "compiled": llm.engine.runner.compiled if plan.compile_modes is None else None,
        "peers": [r.name for p in peers for r in p.runs], "peers_skipped": list(choice.skipped),
        "peer_batch_size": 1,
        "versions": env.versions(), "platform": env.platform_info(),
        "load": {"before": load_before, "after": bm.machine_load()},
    }
    report = {"meta": meta, **results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    pngs = bench_report.write_plots(report, out)
    (out / "report.md").write_text(bench_report.markdown(report, pngs))
    print(bench_report.table(report))
    print(f"wrote {out / 'bench.json'}, {out / 'report.md'}, " + ", ".join(str(p) for p in pngs))
    bad = bm.inexact(report)
    if bad:
        print("flashtree bench: NOT EXACT: " + ", ".join(f"{c['label']} at T={c['temperature']:g} conc "
                                                       f"{c['concurrency']} ({bm.exact_label(c['exact'])})" for c in bad),
              file=sys.stderr)
        return 1
    return 0
