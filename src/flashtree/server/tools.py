"""Tool calling: which output a request's `tool_choice` allows, and the reply's text read back as
OpenAI `tool_calls`.

The model's chat template renders the tools (the template decides how; one that ignores them is
refused, `Tokenizer.renders_tools`). `tool_choice` "required" constrains the output to a JSON array
of {"name", "parameters"} calls (one call unless parallel_tool_calls), a named function to that
function's arguments — both as a JSON schema through the grammar path, so the calls always parse
and validate. "auto" leaves the output free and reads the Hermes format (`<tool_call>{"name",
"arguments"}</tool_call>`, Qwen's and many others') where the template uses it; "none" reads no
calls. Nothing here generates or tokenises.
"""
from __future__ import annotations

import json
import re
import uuid

HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


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


def read_calls(text: str, choice, hermes: bool, finished: bool) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a reply. A constrained reply that did not finish (max_tokens) is
    returned as content: its JSON is cut short."""
    if choice == "none" or (choice == "auto" and not hermes) or not finished and choice != "auto":
        return text, None
    if choice == "auto":
        calls = []
        for m in HERMES.finditer(text):
            try:
                c = json.loads(m.group(1))
            except ValueError:
                continue
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                calls.append(_call(c["name"], c.get("arguments", c.get("parameters", {}))))
        if not calls:
            return text, None
        rest = HERMES.sub("", text).strip()
        return rest or None, calls
    if choice == "required":
        return None, [_call(c["name"], c["parameters"]) for c in json.loads(text)]
    return None, [_call(choice, text.strip())]
