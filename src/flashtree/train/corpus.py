"""The bundled pair's corpus: the Python standard library of the running interpreter.

Whole modules listed in `HELDOUT` are never trained on; the public prompt set
(`flashtree/data/heldout_prompts.jsonl`) is cut from them. This module only reads source
files and writes prompts; tokenising and training live elsewhere.
"""
from __future__ import annotations

import ast
import json
import os
import random
import sysconfig
from pathlib import Path

# Skipped entirely: GUI/demo packages and vendored installers (the `test` package trains,
# minus the tests of held-out modules).
SKIP_TOP = {"site-packages", "dist-packages", "test", "idlelib", "lib2to3", "tkinter", "turtledemo",
            "ensurepip", "pydoc_data", "__pycache__"}
# Held-out modules (about 6% of the corpus bytes on CPython 3.11): never trained on.
HELDOUT = ("email", "json", "argparse.py", "difflib.py", "textwrap.py", "calendar.py", "fractions.py",
           "statistics.py", "pprint.py", "csv.py", "configparser.py", "heapq.py", "http", "logging",
           "xml")
PROMPTS_FILE = Path(__file__).resolve().parent.parent / "data" / "heldout_prompts.jsonl"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files), sorted, from the stdlib at `root`."""
    root = root or stdlib_root()
    train, held = [], []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        parts = Path(d).relative_to(root).parts
        if parts and parts[0] in SKIP_TOP - {"test"}:
            dirs[:] = []
            continue
        in_tests = bool(parts) and parts[0] == "test"
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            top = parts[0] if parts else f
            if in_tests:  # tests train too, except those of held-out modules
                if not any(Path(h).stem in p for h in HELDOUT for p in (*parts, f)):
                    train.append(Path(d) / f)
                continue
            (held if top in HELDOUT else train).append(Path(d) / f)
    return train, held


# Package folders that are not the package's own documented code, or that copy the stdlib (a
# vendored module could carry a held-out one into training).
SKIP_PACKAGE_DIRS = {"tests", "test", "testing", "_vendor", "vendor", "_vendored", "extern", "_distutils",
                     "__pycache__"}
SKIP_PACKAGES = {"pip", "setuptools", "pkg_resources", "_distutils_hack", "flashtree"}
# Packages installed after the training data's package requests were drawn (run 9's 28,000 chats):
# their code is the user-like held-out set's Python (`user_chats.py`) and never trains.
HELDOUT_PACKAGES = ("xgrammar", "importlinter", "grimp", "jsonschema", "referencing", "llguidance", "llama_cpp")


def packages_root() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def package_files(root: Path | None = None) -> list[Path]:
    """The installed packages' .py files under `root` (the running interpreter's site-packages),
    sorted, without their tests, vendored copies, installers or flashtree itself. What is found
    depends on what is installed: the committed data, not this list, is what a run reproduces."""
    root = root or packages_root()
    out = []
    for d, dirs, files in os.walk(root):
        rel = Path(d).relative_to(root).parts
        if rel and (rel[0] in SKIP_PACKAGES or rel[0] in HELDOUT_PACKAGES or rel[0].endswith((".dist-info", ".egg-info", ".data"))):
            dirs[:] = []
            continue
        dirs[:] = sorted(x for x in dirs if x not in SKIP_PACKAGE_DIRS)
        if not rel:  # top-level modules: only those of packages, not .pth helpers
            files = [f for f in files if not f.startswith("_")]
        out += [Path(d) / f for f in sorted(files) if f.endswith(".py") and not f.startswith("test_")]
    return out


def read_source(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def make_prompts(held: list[Path], per_file: int = 8, body_lines: int = 3) -> list[dict]:
    """Prompts = a def/class head, its docstring and the first `body_lines` lines of its body."""
    prompts = []
    for path in held:
        src = read_source(path)
        lines = src.splitlines()
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        taken = 0
        for node in ast.walk(tree):
            if taken >= per_file:
                break
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                continue
            if not ast.get_docstring(node) or len(node.body) < 2:
                continue
            doc_end = node.body[0].end_lineno
            stop = min(doc_end + body_lines, node.end_lineno)
            text = "\n".join(lines[node.lineno - 1 - len(node.decorator_list):stop]) + "\n"
            if len(text) > 1200:
                continue
            rel = path.relative_to(stdlib_root()).as_posix() if path.is_relative_to(stdlib_root()) else path.name
            prompts.append({"id": f"{rel}:{node.lineno}", "prompt": text})
            taken += 1
    return prompts


def write_prompts(out: Path = PROMPTS_FILE) -> int:
    _, held = stdlib_files()
    prompts = make_prompts(held)
    random.Random(0).shuffle(prompts)  # so "the first N prompts" spread over the held-out modules
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    return len(prompts)


def load_prompts(path: str | Path | None = None) -> list[str | list[dict]]:
    """A JSONL file's prompts: each line's 'prompt' (text) or 'messages' (a chat, OpenAI-style)."""
    path = Path(path) if path else PROMPTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: prompt file not found (JSONL with a 'prompt' or 'messages' field per line)")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if "prompt" not in row and not isinstance(row.get("messages"), list):
                raise ValueError(f"{path}:{i}: line has no 'prompt' field and no 'messages' list")
            out.append(row["prompt"] if "prompt" in row else row["messages"])
    return out
