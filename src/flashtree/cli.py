"""`flashtree` command line: one subcommand per module, loaded lazily.

Each command module exposes `add_arguments(parser)` and `run(args) -> int`. Errors a user can
fix (flashtree's own error types, see errors.py) print one line and exit 2; anything else is a
bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import is_user_error

COMMANDS = {
    "generate": ("flashtree.commands.generate", "generate text for a prompt (streams to the terminal)"),
    "chat": ("flashtree.commands.chat", "an interactive chat in the terminal (/reset, /exit)"),
    "models": ("flashtree.commands.models", "list the models flashtree knows by name"),
    "convert": ("flashtree.commands.convert", "convert a .gguf file into an HF directory"),
    "serve": ("flashtree.commands.serve", "run the OpenAI-compatible HTTP server"),
    "bench": ("flashtree.commands.bench", "benchmark methods x budgets x temperatures x concurrency vs peers"),
    "verify": ("flashtree.commands.verify", "statistical losslessness report (exit code != 0 on failure)"),
    "trace": ("flashtree.commands.trace", "write an HTML page showing each round's draft tree"),
    "env": ("flashtree.commands.env", "what this installation can do (versions, device, methods, model pair)"),
    "train-target": ("flashtree.commands.train_target", "train the bundled target LM on the stdlib corpus"),
    "train-drafter": ("flashtree.commands.train_drafter", "train a DFlash drafter for any supported target"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="flashtree", description="Lossless speculative decoding (DFlash / DDTree).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("flashtree"):
                p.set_defaults(_missing=f"'{name}' is not available in this build ({e.name} missing)")
                continue
            raise
        m.add_arguments(p)
        modules[name] = m
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):
        print(f"flashtree: error: {args._missing}", file=sys.stderr)
        return 2
    try:
        if getattr(args, "tensor_parallel_size", 1) > 1 and _torchrun_worker(args):
            return 0
        return int(modules[args.command].run(args) or 0)
    except ValueError as e:
        if not is_user_error(e):
            raise
        print(f"flashtree {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _torchrun_worker(args) -> bool:
    """Under torchrun, ranks > 0 run the target's shard for rank 0 instead of the command (no port,
    no output). True when this process was such a rank (and has finished)."""
    import os

    from .distributed import tp
    if not tp.under_torchrun() or int(os.environ["RANK"]) == 0:
        return False
    from .models.registry import resolve
    tp.serve_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), str(resolve(args.model).target),
                    args.dtype, args.device)
    return True


if __name__ == "__main__":
    sys.exit(main())
