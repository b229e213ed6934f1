"""Tool calling: which output a request's `tool_choice` allows, and the reply's text read back as
OpenAI `tool_calls`.

The model's chat template renders the tools (the template decides how; one that ignores them is
refused, `Tokenizer.renders_tools`). `tool_choice` "required" constrains the output to a JSON array
of {"name", "parameters"} calls (one call unless parallel_tool_calls), a named function to that
function's arguments — both as a JSON schema through the grammar path, so the calls always parse
and validate. "auto" leaves the output free and reads back the calls in the format the template
teaches the model (`call_format`): Hermes (`<tool_call>{"name", "arguments"}</tool_call>`: Qwen
2.5/3, Hermes and many others), Mistral (`[TOOL_CALLS] [{"name", "arguments"}, ...]`) or Llama
3.1–3.3's JSON (a reply that is one or more `{"name", "parameters"}` objects, `;`-separated, after
an optional `<|python_tag|>`); "none" reads no calls. Nothing here generates or tokenises.
"""
from __future__ import annotations

import json
import re
import uuid

HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
MISTRAL = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
LLAMA3_PROMPT = '"parameters": dictionary of argument name'  # Llama 3.x templates' instruction to the model


def call_format(template: str | None) -> str | None:
    """How a chat template teaches the model to write tool calls: "hermes", "mistral" or "llama3"
    (see the module's docstring), read from the markers the template writes; None: none of these,
    so "auto" replies are not read back as calls (they stay text)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if MISTRAL in template:
        return "mistral"
    if PYTHON_TAG in template or LLAMA3_PROMPT in template:
        return "llama3"
    return None


def _parameters(fn: dict) -> dict:
    return fn.get("parameters") or {"type": "object", "properties": {}}


def call_schema(tools: list[dict], choice, parallel: bool) -> dict | None:
    """The JSON schema the output must follow (None: free text). tools: OpenAI's function tools as
    dicts; choice: "none" | "auto" | "required" | a function's name."""
    if choice in ("none", "auto"):
        return None
    fns = {t["function"]["name"]: t["function"] for t in tools}
    if choice != "required":
        return _parameters(fns[choice])
    calls = [{"type": "object", "properties": {"name": {"const": n}, "parameters": _parameters(f)},
              "required": ["name", "parameters"], "additionalProperties": False} for n, f in fns.items()]
    return {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **({} if parallel else {"maxItems": 1})}


def _call(name: str, arguments) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def _as_call(c) -> dict | None:
    """An OpenAI tool call from a parsed {"name", "arguments" | "parameters"} object (None: not one)."""
    if isinstance(c, dict) and isinstance(c.get("name"), str):
        return _call(c["name"], c.get("arguments", c.get("parameters", {})))
    return None


def _hermes(text: str) -> tuple[str | None, list[dict] | None]:
    calls = []
    for m in HERMES.finditer(text):
        try:
            call = _as_call(json.loads(m.group(1)))
        except ValueError:
            continue
        if call is not None:
            calls.append(call)
    if not calls:
        return text, None
    return HERMES.sub("", text).strip() or None, calls


def _mistral(text: str) -> tuple[str | None, list[dict] | None]:
    """Content, then `[TOOL_CALLS]` and a JSON array of calls."""
    at = text.find(MISTRAL)
    if at < 0:
        return text, None
    try:
        items, _ = json.JSONDecoder().raw_decode(text[at + len(MISTRAL):].lstrip())
    except ValueError:
        return text, None
    calls = [_as_call(c) for c in (items if isinstance(items, list) else [items])]
    if not calls or None in calls:
        return text, None
    return text[:at].strip() or None, calls


def _llama3(text: str) -> tuple[str | None, list[dict] | None]:
    """The whole reply is the calls: JSON objects separated by `;` (the model writes prose otherwise)."""
    rest, calls, decoder = text.strip(), [], json.JSONDecoder()
    rest = rest[len(PYTHON_TAG):].lstrip() if rest.startswith(PYTHON_TAG) else rest
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except ValueError:
            return text, None
        call = _as_call(obj)
        if call is None:
            return text, None
        calls.append(call)
        rest = rest[end:].lstrip().removeprefix(";").lstrip()
    return (None, calls) if calls else (text, None)


READERS = {"hermes": _hermes, "mistral": _mistral, "llama3": _llama3}


def read_calls(text: str, choice, calls_as: str | None, finished: bool) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a reply; `calls_as`: the template's call format (`call_format`),
    which "auto" reads. A constrained reply that did not finish (max_tokens) is returned as
    content: its JSON is cut short."""
    if choice == "none" or (choice == "auto" and calls_as is None) or not finished and choice != "auto":
        return text, None
    if choice == "auto":
        return READERS[calls_as](text)
    if choice == "required":
        return None, [_call(c["name"], c["parameters"]) for c in json.loads(text)]
    return None, [_call(choice, text.strip())]
