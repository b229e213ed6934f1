"""OpenAI wire format: pydantic schemas for requests, responses, stream chunks and errors.

Requests are parsed strictly from the raw JSON body (`parse_request`): wrong types and unknown
fields are errors, and OpenAI parameters flashtree cannot honour (logprobs, tools, penalties, ...)
are rejected by name unless they carry their no-op value — never silently ignored. Value ranges
(temperature >= 0, 0 < top_p <= 1, ...) are checked once, by `SamplingParams`. This module knows
nothing about the engine, tokenisation or HTTP routing.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import UserError
from ..sampling_params import MAX_LOGPROBS, SamplingParams, StructuredOutput
from ..speculative.proposer import METHODS
from .tools import call_schema

MAX_N = 128


class APIError(Exception):
    """An error answered as OpenAI error JSON: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, retry_after: int | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ------------------------------------------------------------------------------------ requests
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Speculative(_Strict):
    method: Literal[METHODS] | None = None  # the registry's names (speculative/proposer.py)
    budget: int | str | None = None  # an int or "auto"; the engine checks it (its message names both)
    topk: int | None = None       # most children per ddtree node (1 = a chain)
    block_size: int | None = None
    max_ngram: int | None = None  # ngram: longest suffix n-gram looked up
    min_ngram: int | None = None  # ngram: shortest
    draft_len: int | None = None  # ngram: longest chain copied per round

    def options(self) -> dict:
        """The method-specific settings given (passed to the engine as keyword options)."""
        return {k: v for k in ("max_ngram", "min_ngram", "draft_len") if (v := getattr(self, k)) is not None}


class JSONSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None   # the schema is enforced either way (flashtree has no best-effort mode)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # accepted for vLLM clients; usage still comes once


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str   # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None   # None only on an assistant message with tool_calls
    name: str | None = None
    tool_calls: list[ToolCall] | None = None      # an assistant's calls (sent back in an agent's next turn)
    tool_call_id: str | None = None               # a tool message: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it (HF's convention: a call's arguments as a dict)."""
        out = {"role": self.role, "content": self.text(), **({"name": self.name} if self.name else {})}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _json_or_text(s: str):
    try:
        return json.loads(s)
    except ValueError:
        return s


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")   # OpenAI's rule
    description: str | None = None
    parameters: dict[str, Any] | None = None   # a JSON schema of the arguments (None: no arguments)
    strict: bool | None = None                 # the arguments are always held to `parameters`


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' logprobs cap (OpenAI's; chat's top_logprobs: MAX_LOGPROBS)

# OpenAI parameters flashtree does not implement, with the values that mean "off".
_NO_OP = {
    "functions": (None, []), "function_call": (None, "none"),
    "suffix": (None, ""),
    "best_of": (None, 1), "prediction": (None,), "audio": (None,), "modalities": (None, ["text"]),
    "reasoning_effort": (None,), "web_search_options": (None,),
}


def _is_no_op(value, no_ops: tuple) -> bool:
    # type-aware: False is not the penalty 0, 0 is not logprobs=False
    return any(value is None if d is None else (type(value) is type(d) or {type(value), type(d)} == {int, float})
               and value == d for d in no_ops)


class _Sampling(_Strict):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)   # None: 1
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extensions
    top_k: int | None = None       # -1 or 0: off
    min_p: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    speculative: Speculative | None = None
    # logit processors (logit_processors.py): OpenAI's, and vLLM's repetition_penalty / min_tokens
    logit_bias: dict[str, float] | None = None   # token id (as a string, as OpenAI sends it) -> bias
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    # structured output (grammar.py): OpenAI's response_format, and vLLM's guided_* extensions
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None   # EBNF, as xgrammar reads it (GBNF: `root ::= ...`)

    def structured(self) -> StructuredOutput | None:
        """The one output constraint asked for (None: free text); more than one is a 400."""
        rf = self.response_format if self.response_format is not None and self.response_format.type != "text" else None
        given = [n for n in ("guided_json", "guided_regex", "guided_grammar") if getattr(self, n) is not None]
        tools = self.tools_schema() if isinstance(self, ChatCompletionRequest) else None
        if tools is not None:
            given = ["tool_choice", *given]
        if len(given) + (rf is not None) > 1:
            named = given + ["response_format"] * (rf is not None)
            raise APIError(400, f"at most one output constraint per request: got {', '.join(named)}", param=named[-1])
        try:
            if rf is not None and rf.type == "json_object":
                return StructuredOutput(json_object=True)
            if rf is not None:
                if rf.json_schema is None or rf.json_schema.schema_ is None:
                    raise APIError(400, "response_format of type json_schema needs json_schema.schema",
                                   param="response_format.json_schema")
                return StructuredOutput(json_schema=rf.json_schema.schema_)
            if tools is not None:
                return StructuredOutput(json_schema=tools)
            if given:
                return StructuredOutput(**{given[0].removeprefix("guided_").replace("json", "json_schema"):
                                           getattr(self, given[0])})
        except UserError as e:
            raise APIError(400, str(e), param=given[0] if given else "response_format") from None
        return None

    def field_of(self, param: str | None) -> str | None:
        """The request field behind an engine error's parameter: a constraint's kind (grammar.py
        names it) is the field that asked for it."""
        if param not in ("json_schema", "json_object", "regex", "grammar", "structured"):
            return param
        if isinstance(self, ChatCompletionRequest) and self.tools_schema() is not None:
            return "tool_choice"
        return next((n for n in ("guided_json", "guided_regex", "guided_grammar") if getattr(self, n) is not None),
                    "response_format")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def choices(self) -> int:
        return self.n or 1

    def top_logprobs_asked(self) -> int | None:
        """How many alternatives each token's logprobs list (None: no logprobs)."""
        return None

    def prompt_logprobs_asked(self) -> int | None:
        """The same for the prompt's tokens (completions' echo)."""
        return None

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with integer token ids; a key that is not one is a 400."""
        if not self.logit_bias:
            return None
        try:
            return {int(k): v for k, v in self.logit_bias.items()}
        except ValueError:
            raise APIError(400, "logit_bias keys must be token ids (integers as strings, e.g. {\"50256\": -100})",
                           param="logit_bias") from None

    def unsupported(self) -> str | None:
        """The first parameter set to a value flashtree cannot honour, or None."""
        for name in type(self).model_fields:
            if name in _NO_OP and not _is_no_op(getattr(self, name), _NO_OP[name]):
                return name
        return None

    def sampling_params(self, choice: int, max_tokens: int) -> SamplingParams:
        """Parameters for the choice-th sample; a seeded request gives choice i the seed seed+i."""
        seed = None if self.seed is None else self.seed + choice
        if seed is not None and seed >= 2**64 and self.seed < 2**64:  # choice i of seed 2^64-1 wraps
            seed -= 2**64
        try:
            return SamplingParams(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=0 if self.top_k in (None, -1) else self.top_k,
                min_p=self.min_p or 0.0, max_tokens=max_tokens, seed=seed, stop=self.stop or None,
                stop_token_ids=self.stop_token_ids, ignore_eos=bool(self.ignore_eos),
                logprobs=self.top_logprobs_asked(), logit_bias=self.token_biases(),
                prompt_logprobs=self.prompt_logprobs_asked(),
                presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                min_tokens=self.min_tokens or 0, structured=self.structured())
        except ValueError as e:
            m = re.match(r"SamplingParams\.(\w+)", str(e))
            param = m.group(1) if m else None
            if param == "max_tokens" and isinstance(self, ChatCompletionRequest) and self.max_completion_tokens is not None:
                param = "max_completion_tokens"
            raise APIError(400, str(e).removeprefix("SamplingParams."), param=param) from None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    prediction: Any = None
    audio: Any = None
    modalities: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_mode(self) -> str | None:
        """None (no tools), "none", "auto" (OpenAI's default with tools), "required", or the name of
        the one function to call. A choice that names no given tool is a 400."""
        c = self.tool_choice
        if not self.tools:
            if c not in (None, "none"):
                raise APIError(400, "tool_choice needs tools", param="tool_choice")
            return None
        if isinstance(c, NamedToolChoice):
            if c.function.name not in {t.function.name for t in self.tools}:
                raise APIError(400, f"tool_choice names the function '{c.function.name}', which is not in tools",
                               param="tool_choice")
            return c.function.name
        return c or "auto"

    def template_tools(self, renders: Callable[[], bool]) -> list[dict] | None:
        """The tools as the chat template reads them (None: none asked). A 400 where the template
        does not render tools (`renders()`: whether it does)."""
        mode = self.tool_mode()
        if mode is None:
            return None
        if not renders():
            raise APIError(400, "this model's chat template does not render tools, so the model cannot be told "
                                "about them; send the tools in a message instead", param="tools")
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def tools_schema(self) -> dict | None:
        """The JSON schema tool_choice holds the output to (None: free text)."""
        mode = self.tool_mode()
        if mode is None:
            return None
        return call_schema([t.model_dump(exclude_none=True) for t in self.tools], mode,
                           self.parallel_tool_calls is not False)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: Any = None
    echo: bool | None = None   # the prompt before the completion (with logprobs: its tokens' too, the first's null)
    best_of: Any = None

    def prompt_logprobs_asked(self) -> int | None:
        return self.logprobs if self.echo else None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


def _is_union_tag(part) -> bool:
    """pydantic puts the tried union member in an error's loc ('str', 'list[TextPart]'); not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "none") or "[" in part)


def parse_request(cls: type[_Sampling], body: bytes) -> _Sampling:
    """Validate a raw JSON body; any problem becomes a 400 APIError naming the parameter."""
    try:
        req = cls.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err["loc"] if not _is_union_tag(x))
        if err["type"] == "json_invalid":
            raise APIError(400, f"the request body is not valid JSON: {err['msg']}") from None
        if err["type"] == "extra_forbidden":
            raise APIError(400, f"unrecognized request argument supplied: {loc}", param=loc) from None
        if err["type"] == "model_type" and not loc:
            raise APIError(400, "the request body must be a JSON object") from None
        raise APIError(400, f"{loc}: {err['msg']}" if loc else err["msg"], param=loc or None) from None
    bad = req.unsupported()
    if bad:
        raise APIError(400, f"'{bad}' is not supported by flashtree (got {getattr(req, bad)!r}); "
                            "remove it or set it to its default", param=bad)
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true (the alternatives are listed beside each token's "
                            "own log-probability)", param="top_logprobs")
    if req.stop_token_ids is not None and any(t < 0 for t in req.stop_token_ids):
        raise APIError(400, "stop_token_ids must be non-negative token ids", param="stop_token_ids")
    return req


# ------------------------------------------------------------------------------------ responses
class SpecUsage(BaseModel):
    rounds: int
    mean_accept_length: float
    accept_length_histogram: list[int]   # [t-1] = rounds that committed t tokens
    topk: int | None = None              # the ddtree branching cap applied (None: no cap, or no tree)
    # budget="auto" rounds: nodes verified -> rounds (keys are counts as strings), and the mean tau
    # the calibration predicted for them (compare with mean_accept_length); None without auto rounds
    budget_histogram: dict[str, int] | None = None
    mean_predicted_accept_length: float | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    spec: SpecUsage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """Each completion token's log-probability under the model's own distribution (its logits'
    log-softmax, before temperature and the filters) and its likeliest alternatives."""
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]         # None: an echoed prompt's first token (nothing before it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(ToolCall):
    index: int   # the call's place among the reply's calls (OpenAI's stream shape)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    """Also the stream chunk of /v1/completions (OpenAI uses one shape for both)."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "flashtree"
    max_model_len: int
    methods: list[str] = list(METHODS)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _top(token_text, token: int, logprob: float, cls=TopLogprob, **more):
    text = token_text(token)
    return cls(token=text, logprob=logprob, bytes=list(text.encode()), **more)


def chat_logprobs(entries, token_text) -> ChatLogprobs | None:
    """TokenLogprobs (engine) -> a chat choice's `logprobs` (None for none). `token_text`: a
    token id's own text."""
    if not entries:
        return None
    return ChatLogprobs(content=[_top(token_text, e.token, e.logprob, ChatTokenLogprob,
                                      top_logprobs=[_top(token_text, t, v) for t, v in e.top]) for e in entries])


def completion_logprobs(entries, token_text, offset: int = 0) -> CompletionLogprobs | None:
    """TokenLogprobs -> a completion choice's `logprobs`: tokens, their logprobs, each position's
    alternatives ({text: logprob}), and where each token's text starts (from `offset` characters)."""
    if not entries:
        return None
    tokens = [token_text(e.token) for e in entries]
    starts = [offset]
    for t in tokens[:-1]:
        starts.append(starts[-1] + len(t))
    return CompletionLogprobs(tokens=tokens, token_logprobs=[e.logprob for e in entries],
                              top_logprobs=[{token_text(t): v for t, v in e.top} for e in entries],
                              text_offset=starts)


def echoed(prompt_ids: list[int], prompt_entries, text: str, entries, token_text, decode
           ) -> tuple[str, CompletionLogprobs | None]:
    """A completion choice with its prompt echoed before it: the text, and with logprobs the prompt's
    tokens' entries first (`prompt_entries`: the first token's None) then the completion's."""
    if not prompt_entries:
        return decode(prompt_ids) + text, None
    head = CompletionLogprobs(tokens=[token_text(t) for t in prompt_ids],
                              token_logprobs=[None] + [e.logprob for e in prompt_entries[1:]],
                              top_logprobs=[None] + [{token_text(t): v for t, v in e.top} for e in prompt_entries[1:]],
                              text_offset=[])
    for t in head.tokens:
        head.text_offset.append(head.text_offset[-1] + len(t) if head.text_offset else 0)
    tail = completion_logprobs(entries, token_text, sum(map(len, head.tokens)))
    if tail is not None:
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            getattr(head, name).extend(getattr(tail, name))
    return "".join(head.tokens[:len(prompt_ids)]) + text, head


# ------------------------------------------------------------------------------------ OpenAPI
ROUTES = {"/v1/chat/completions": (ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
          "/v1/completions": (CompletionRequest, Completion, Completion)}


def describe(doc: dict) -> dict:
    """FastAPI's OpenAPI document with the two generation routes' request, response and stream
    chunk schemas (the routes read raw bodies, so FastAPI alone sees none)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})

    def ref(model) -> dict:
        if model.__name__ not in schemas:
            s = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(s.pop("$defs", {}))
            schemas[model.__name__] = s
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    for path, (request, response, chunk) in ROUTES.items():
        op = doc["paths"][path]["post"]
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(request)}}}
        op["responses"]["200"] = {"description": "the completion; with stream: SSE `data:` chunks, then "
                                                  "`data: [DONE]`",
                                  "content": {"application/json": {"schema": ref(response)},
                                              "text/event-stream": {"schema": ref(chunk)}}}
    return doc
