"""`flashtree chat`: an interactive chat in the terminal, as `ollama run` offers.

Reads a message a line, streams the answer, keeps the conversation; `/reset` starts over,
`/exit` (or Ctrl-D) leaves, Ctrl-C stops the answer being written. After each answer one line
gives its tokens, tok/s and mean accept length τ. The model, method and sampling options are
those of `generate`; sampling defaults to temperature 0.7, top-p 0.95 (`--temperature 0`: greedy).
"""
from __future__ import annotations

import sys

from .generate import add_model_arguments, load_llm, sampling_params

HELP = "/reset: start a new conversation · /exit: leave · Ctrl-C: stop an answer"


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=512, help="longest answer (default 512)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--system", default=None, help="a system message opening the conversation")


def run(args) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    if not llm.tokenizer.chat_template:
        from ..errors import UserError
        raise UserError(f"the model in {llm.model_path} has no chat template; use flashtree generate")
    name = llm.model_name or str(llm.model_path)
    print(f"flashtree chat · {name} · {args.method} · {str(llm.engine.dtype).removeprefix('torch.')}\n{HELP}",
          flush=True)
    opening = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(opening)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            return 0
        if text == "/reset":
            messages = list(opening)
            print("(a new conversation)", flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}; {HELP}", flush=True)
            continue
        messages.append({"role": "user", "content": line})
        answer = []
        try:
            for piece in llm.stream(llm.tokenizer.encode_chat(messages), params):
                answer.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            print(" [stopped]", end="")
        m = llm.last.metrics
        messages.append({"role": "assistant", "content": "".join(answer)})
        rate = m.completion_tokens / max(m.elapsed_s, 1e-9)
        print(f"\n[{m.completion_tokens} tokens · {rate:.1f} tok/s · τ {m.mean_accept_length:.2f}]", flush=True)
