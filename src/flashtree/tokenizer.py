"""Tokenizer: `tokenizer.json` through the `tokenizers` library, the chat template from
`chat_template.jinja` (where current transformers writes it) or `tokenizer_config.json`,
rendered with jinja2 the way transformers renders it, and eos ids from config.json /
generation_config.json / the tokenizer's eos token. No model code here.

Special tokens typed by a user are text: `encode(text, special=False)` and `encode_chat` turn
'<|endoftext|>' in user content into ordinary tokens, while the chat template's own special
tokens stay special. The HTTP server uses these; a client that wants special tokens in a prompt
sends token ids."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .config import ConfigError
from .errors import UserError


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in (x if isinstance(x, list) else [x])]


def _token_text(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


class Tokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ConfigError(f"{tj}: file not found (flashtree needs a `tokenizers` tokenizer.json)")
        self.tk = HFTokenizer.from_file(str(tj))
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        jinja = path / "chat_template.jinja"  # transformers >= 4.53 saves the template here, and prefers it
        self.chat_template: str | None = jinja.read_text() if jinja.is_file() else cfg.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()))
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.add_bos = bool(cfg.get("add_bos_token", False)) and self.bos_token is not None
        # the special tokens with a role (bos, eos, pad, unk): never free for another use
        self.role_tokens = tuple(t for t in (_token_text(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token",
                                                                                "unk_token")) if t)
        eos = set()
        for name in ("config.json", "generation_config.json"):
            f = path / name
            if f.is_file():
                eos.update(_as_list(json.loads(f.read_text()).get("eos_token_id")))
        if self.eos_token and self.tk.token_to_id(self.eos_token) is not None:
            eos.add(self.tk.token_to_id(self.eos_token))
        self.eos_token_ids: list[int] = sorted(eos)
        self.vocab_size = self.tk.get_vocab_size()
        self._template = None
        self._renders_tools: bool | None = None
        self._plain = HFTokenizer.from_file(str(tj))  # the same tokenizer, special tokens as text
        self._plain.encode_special_tokens = True
        # byte-level BPE covers every byte with a token of at most this many bytes, so a text of
        # b bytes has at least b / max_bytes_per_token tokens (a length check before tokenising)
        byte_level = "ByteLevel" in repr(self.tk.pre_tokenizer)
        self.max_bytes_per_token: int | None = (
            max(len(t.encode()) for t in self.tk.get_vocab(with_added_tokens=True)) if byte_level else None)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of text; special=False encodes special-token strings as plain text."""
        ids = (self.tk if special else self._plain).encode(text, add_special_tokens=False).ids
        if self.add_bos:
            ids = [self.tk.token_to_id(self.bos_token)] + ids
        return ids

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)) computed without tokenising (0 if unknown)."""
        if self.max_bytes_per_token is None:
            return 0
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.max_bytes_per_token)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The rendered chat template's ids (with `tools`, OpenAI's function tools, where given), the
        messages' contents encoded as plain text (a user cannot inject the template's special tokens)."""
        text = self.apply_chat_template(messages, tools=tools)
        specials = [t for t in self.tk.get_added_tokens_decoder().values() if t.special]
        if not any(t.content in m["content"] for t in specials for m in messages):
            return self.encode(text)  # nothing to escape (the common case)
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        marked = self.apply_chat_template([{**m, "content": k} for m, k in zip(messages, marks)], tools=tools)
        ids, rest = [], marked
        if self.add_bos:
            ids.append(self.tk.token_to_id(self.bos_token))
        for m, k in zip(messages, marks):
            head, sep, rest = rest.partition(k)
            if not sep:
                raise UserError("a message contains a special token, and this chat template does not pass "
                                 "message contents through verbatim; send token ids to /v1/completions instead")
            ids += self.tk.encode(head, add_special_tokens=False).ids if head else []
            ids += self._plain.encode(m["content"], add_special_tokens=False).ids
        return ids + (self.tk.encode(rest, add_special_tokens=False).ids if rest else [])

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tk.token_to_id(token)

    def renders_tools(self) -> bool:
        """Whether the chat template renders a request's tools (it changes when given one)."""
        if self._renders_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = [{"type": "function", "function": {"name": "probe_fn", "description": "probe",
                                                      "parameters": {"type": "object", "properties": {}}}}]
            try:
                self._renders_tools = self.apply_chat_template(probe, tools=tool) != self.apply_chat_template(probe)
            except Exception:  # a template that fails on tools does not render them
                self._renders_tools = False
        return self._renders_tools

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        if not self.chat_template:
            raise UserError("this model has no chat template (neither chat_template.jinja nor a chat_template in "
                            "tokenizer_config.json); use generate() with a prompt")
        if not isinstance(messages, list) or not messages:
            raise UserError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
                raise UserError(f"messages[{i}] must be a dict with a 'role' and a string 'content'")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                     **({"tools": tools} if tools else {}))


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)
