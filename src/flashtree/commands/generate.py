"""`flashtree generate PROMPT`: stream a completion to the terminal, or print one JSON object."""
from __future__ import annotations

import argparse
import json
import sys

from ..engine.engine_config import PRECOMPILE, default
from ..errors import UserError
from ..speculative.proposer import METHODS, default_method, proposer_class, takers


def budget_arg(text: str) -> int | str:
    """--budget: an integer (its range is the engine's check) or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


def add_model_arguments(p) -> None:
    """Options shared by every command that loads a model pair."""
    p.add_argument("--model", default=None, help="a model name (flashtree models), an HF directory or a .gguf "
                   "file (default: the default model, see flashtree models)")
    p.add_argument("--draft", default=None, help="DFlash drafter directory (default: the named model's own)")
    p.add_argument("--method", default=None, choices=METHODS,
                   help="decoding method (default: hybrid when the model has a drafter, else ngram; both budget auto)")
    p.add_argument("--budget", type=budget_arg, default=None,
                   help="DDTree draft nodes per round, or 'auto': the size that maximises tokens/s, chosen "
                        "each round from calibrated acceptance and measured costs")
    p.add_argument("--topk", type=int, default=None,
                   help="DDTree branching cap: at most K children per node, 1 = a chain (default: no cap)")
    p.add_argument("--block-size", type=int, default=None, help="drafter block size (<= the drafter's)")
    p.add_argument("--max-ngram", type=int, default=None, help="ngram: longest suffix n-gram looked up (default 3)")
    p.add_argument("--min-ngram", type=int, default=None, help="ngram: shortest suffix n-gram looked up (default 1)")
    p.add_argument("--draft-len", type=int, default=None, help="ngram: longest chain copied per round (default 10)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (activations and float weights)")
    p.add_argument("--quant", default="auto", choices=("auto", "blocks", "none", "q8_0", "q4_0"),
                   help="weights in blocks on the CPU: blocks keeps a GGUF file's Q8_0/Q4_0/Q4_1 blocks (other types "
                        "dequantized, with a warning), none runs float weights, q8_0/q4_0 quantize every projection "
                        "at load; auto (default): blocks where that decodes faster (`flashtree env` says which)")
    p.add_argument("--compile", dest="compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compiled forwards (torch.compile; default: on where it pays, off with FLASHTREE_COMPILE=0); "
                        "--no-compile runs eager PyTorch")
    p.add_argument("--precompile", choices=PRECOMPILE, default=None,
                   help="compiled graphs built at load: single (what one sequence runs; batch graphs compile on "
                        "first use), all, or background (single, then the batch graphs in a helper process while "
                        "batches run eager) (default: background for serve, all for bench, single otherwise)")
    p.add_argument("--kv-cache-tokens", type=int, default=None,
                   help="paged KV cache capacity in tokens (default: --max-batch-size sequences at the full context, "
                        "at most half the memory available at load; memory is committed as rows are written)")
    p.add_argument("--threads", type=int, default=None,
                   help="the most compute threads (default: FLASHTREE_THREADS, else one per core); they follow the "
                        "cores other processes leave free unless FLASHTREE_THREAD_POLICY=fixed")
    p.add_argument("--page-size", type=int, default=default("page_size"),
                   help=f"KV cache tokens per page (default {default('page_size')})")
    p.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV pages of a prompt prefix seen before (default: on)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="shard the target over N ranks (torch.distributed: gloo on CPU, NCCL on CUDA); spawned "
                        "here, or one per process under torchrun (default 1)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="prompt rows prefilled per step (the chunks padded to the longest); longer prompts are "
                        "prefilled in chunks between the running requests' rounds (default 256)")
    p.add_argument("--prefill-stall", type=prefill_stall, default=default("prefill_stall"),
                   help="while requests decode, a step's prompt chunks take at most this many of their rounds "
                        f"(learned times; default {default('prefill_stall'):g}); 'off': the row budget only")


def prefill_stall(value: str) -> float | None:
    return None if value == "off" else float(value)


def add_sampling_arguments(p) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=None)


def sampling_params(args):
    from ..sampling_params import SamplingParams
    try:  # SamplingParams validates its fields with ValueError; here every field is a flag's value
        return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, max_tokens=args.max_tokens, seed=args.seed,
                              stop=getattr(args, "stop", None) or None)
    except ValueError as e:
        raise UserError(str(e)) from None


def load_llm(args, precompile: str = "single", **kw):
    """The LLM the command-line arguments name; `precompile` is the command's own default when
    --precompile is not given (see `engine_config.PRECOMPILE`)."""
    from ..llm import LLM
    from ..models.loader import resolve_device, resolve_dtype
    try:  # --device / --dtype, checked before any weights load
        resolve_dtype(args.dtype, resolve_device(args.device))
    except (ValueError, RuntimeError) as e:
        raise UserError(f"--device {args.device} --dtype {args.dtype}: {e}") from None
    if args.method is None:
        from ..models.registry import resolve
        args.method = default_method(resolve(args.model, args.draft).drafter is not None)
    check_topk(args)
    return LLM(model=args.model, draft=args.draft, method=args.method, budget=args.budget, topk=args.topk,
               block_size=args.block_size, device=args.device, dtype=args.dtype, quant=args.quant,
               max_ngram=getattr(args, "max_ngram", None), min_ngram=getattr(args, "min_ngram", None),
               draft_len=getattr(args, "draft_len", None),
               compile="auto" if getattr(args, "compile", None) is None else args.compile,
               kv_cache_tokens=args.kv_cache_tokens, page_size=args.page_size,
               enable_prefix_caching=args.enable_prefix_caching, max_num_batched_tokens=args.max_num_batched_tokens,
               prefill_stall=args.prefill_stall, tensor_parallel_size=args.tensor_parallel_size,
               threads=getattr(args, "threads", None), precompile=getattr(args, "precompile", None) or precompile, **kw)


def check_topk(args) -> None:
    """--topk: 1 <= K <= the budget, and only with a method that builds a tree (checked before any weights load)."""
    from ..engine.engine_config import AUTO_MAX_BUDGET, DEFAULT_BUDGET
    from ..speculative.limits import AUTO
    if args.topk is None:
        return
    if "topk" not in proposer_class(args.method).options:
        raise UserError(f"--topk caps the branching of a DDTree; --method {args.method} has no tree: "
                        f"drop --topk or use --method {' or '.join(takers('topk'))}")
    budget = args.budget if args.budget is not None else DEFAULT_BUDGET
    budget = AUTO_MAX_BUDGET if budget == AUTO else budget  # auto trees hold up to AUTO_MAX_BUDGET nodes
    if not 1 <= args.topk <= budget:
        raise UserError(f"--topk must be in [1, {budget}] (1 = a chain; at most the budget"
                        f"{'' if args.budget is not None else ', default ' + str(DEFAULT_BUDGET)}), got {args.topk}")


def add_prompt_arguments(p) -> None:
    p.add_argument("prompt", help="prompt text (use --chat to wrap it as a user message)")
    p.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")


def resolve_prompt(llm, args) -> str:
    if args.chat:
        if not llm.tokenizer.chat_template:
            raise UserError(f"--chat: the model in {llm.model_path} has no chat template")
        return llm.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    return args.prompt


def add_arguments(p) -> None:
    add_prompt_arguments(p)
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object {text, token_ids, finish_reason, metrics}")


def run(args) -> int:
    params = sampling_params(args)  # validate before loading anything
    llm = load_llm(args)
    prompt = resolve_prompt(llm, args)
    if args.json:
        o = llm.generate([prompt], params, use_tqdm=False)[0]
        print(json.dumps({"text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason,
                          "metrics": o.metrics.to_dict()}))
        return 0
    sys.stdout.write(prompt)
    for piece in llm.stream(prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    m = llm.last.metrics
    print(f"\n[{m.completion_tokens} tokens, {m.elapsed_s:.2f}s, {m.completion_tokens / max(m.elapsed_s, 1e-9):.1f} tok/s, "
          f"mean accept length {m.mean_accept_length:.2f}, finish {llm.last.finish_reason}]", file=sys.stderr)
    return 0
