"""Chat prompts for a chat model's drafter, built from text every machine has offline.

From the Python standard library (corpus.py's split: held-out modules never train) each
documented function or class becomes requests a user would send a chat model — explain it,
write it from its docstring, edit it, test it, summarise its documentation — and each module
docstring a general question. `chat_prompts(split)` returns them shuffled, as OpenAI-style
message lists; asked for more training requests than the stdlib gives (`at_least`), it appends
the same requests built from the installed packages' code (`corpus.package_files`), after the
stdlib ones, so a larger data set keeps the smaller one as its prefix. `write_heldout` writes the
held-out set the benchmarks read. Nothing here runs a model or tokenises.
"""
from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from .corpus import package_files, packages_root, read_source, stdlib_files, stdlib_root

HELDOUT_CHATS = Path(__file__).resolve().parent.parent / "data" / "heldout_chats.jsonl"
HELDOUT_USER_CHATS = HELDOUT_CHATS.parent / "heldout_user_chats.jsonl"  # user_chats.py: where users are
MAX_CODE_CHARS = 1200  # ~300 tokens: a quoted function stays a small part of the context


def _first_sentence(doc: str) -> str:
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    return line.split(". ")[0].rstrip(".")


def _code_requests(name: str, code: str, doc: str, module: str) -> list[tuple[str, str]]:
    """(kind, text) requests about one documented function or class."""
    what = _first_sentence(doc)
    block = f"```python\n{code}\n```"
    out = [("explain", f"Explain what this Python code does:\n\n{block}"),
           ("test", f"Write pytest unit tests for this code:\n\n{block}"),
           ("edit", f"Rewrite this code to be clearer, and add type hints:\n\n{block}")]
    if what and len(what) > 12:
        lowered = what[0].lower() + what[1:]
        out += [("write", f"Write a Python function `{name}` that does the following: {lowered}."),
                ("general", f"How do I {lowered[:1].lower() + lowered[1:]} in Python? ({module})")]
    return out


def _module_requests(module: str, doc: str) -> list[tuple[str, str]]:
    text = doc.strip()
    out = [("general", f"What is the Python module `{module}` used for? Give an example.")]
    if len(text) > 200:
        out.append(("summarise", f"Summarise this documentation in a few sentences:\n\n{text[:1500]}"))
    return out


def _requests(path: Path, root: Path | None = None) -> list[dict]:
    src = read_source(path)
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in a file
        return []
    root = root or stdlib_root()
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    found: list[tuple[str, str, str]] = []
    doc = ast.get_docstring(tree)
    if doc:
        found += [(kind, text, f"{rel}:0") for kind, text in _module_requests(module, doc)]
    lines = src.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        d = ast.get_docstring(node)
        if not d or node.name.startswith("_"):
            continue
        code = "\n".join(lines[node.lineno - 1 - len(node.decorator_list):node.end_lineno])
        if len(code) > MAX_CODE_CHARS:
            continue
        found += [(kind, text, f"{rel}:{node.lineno}") for kind, text in _code_requests(node.name, code, d, module)]
    return [{"id": f"{where}:{kind}", "kind": kind, "messages": [{"role": "user", "content": text}]}
            for kind, text, where in found]


def chat_prompts(split: str = "train", seed: int = 0, at_least: int = 0, packages: Path | None = None
                 ) -> list[dict]:
    """Every request from the train (or held-out) modules, shuffled: {id, kind, messages}. For the
    train split, when that is fewer than `at_least`, then every request from the packages under
    `packages` (default: site-packages), shuffled apart and appended; none repeats a held-out text."""
    train, held = stdlib_files()
    rows = [r for p in (train if split == "train" else held) if not _in_tests(p) for r in _requests(p)]
    random.Random(seed).shuffle(rows)
    if split == "train" and len(rows) < at_least:
        root = packages or packages_root()
        held_texts = {r["messages"][0]["content"] for r in chat_prompts("heldout", seed)}
        extra = [{**r, "id": f"packages/{r['id']}"} for p in package_files(root) for r in _requests(p, root)
                 if r["messages"][0]["content"] not in held_texts]
        random.Random(seed).shuffle(extra)
        rows += extra
    return rows


def _in_tests(path: Path) -> bool:
    root = stdlib_root()
    return path.is_relative_to(root) and path.relative_to(root).parts[0] == "test"


def write_heldout(out: Path = HELDOUT_CHATS, per_kind: int = 16) -> int:
    """The held-out set: `per_kind` requests of each kind, quoting code or not (`kind`)."""
    rows, taken = [], {}
    for r in chat_prompts("heldout", seed=1):
        if taken.get(r["kind"], 0) < per_kind:
            taken[r["kind"]] = taken.get(r["kind"], 0) + 1
            rows.append(r)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def load_heldout(path: str | Path | None = None) -> list[dict]:
    path = Path(path) if path else HELDOUT_CHATS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: chat prompt file not found (JSONL with 'messages' per line)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
