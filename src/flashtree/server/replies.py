"""OpenAI response and stream-chunk shapes built from the engine's updates: a choice's text,
its logprobs, tool calls read back (`tools.py`), an echoed prompt, and the usage with flashtree's
speculation counters. Nothing here talks to the engine or reads a request body."""
from __future__ import annotations

import time
import uuid

from ..engine.sequence import tau_histogram
from .async_engine import Update
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    SpecUsage,
    ToolCallDelta,
    Usage,
    chat_logprobs,
    completion_logprobs,
    echoed,
)


class Format:
    """OpenAI response and chunk shapes of one endpoint ("chat" or "text")."""
    __slots__ = ("kind", "model", "id", "created", "token_text", "calls", "echo", "decode")

    def __init__(self, kind: str, model: str, token_text=None, calls=None, echo=None, decode=None):
        self.kind, self.model, self.created = kind, model, int(time.time())
        self.token_text = token_text  # a token id's own text (logprobs)
        self.calls = calls  # (text, finished) -> (content, tool_calls): a chat with tools (server/tools.py)
        self.echo, self.decode = echo, decode  # completions' echo: each choice's prompt ids, and ids -> text
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex

    def _envelope(self):
        return dict(id=self.id, created=self.created, model=self.model)

    def head(self, index: int):
        if self.kind != "chat":
            return None
        return ChatCompletionChunk(**self._envelope(), choices=[ChatChunkChoice(
            index=index, delta=ChatDelta(role="assistant", content=""))])

    def chunk(self, index: int, text: str, finish_reason: str | None, logprobs=(), offset: int = 0):
        """One choice's delta; `logprobs`: its tokens' entries not sent yet, whose text starts at
        character `offset` of the choice's (completions' text_offset)."""
        if self.kind == "chat":
            return ChatCompletionChunk(**self._envelope(), choices=[ChatChunkChoice(
                index=index, delta=ChatDelta(content=text or None), finish_reason=finish_reason,
                logprobs=chat_logprobs(logprobs, self.token_text))])
        return Completion(**self._envelope(), choices=[CompletionChoice(
            index=index, text=text, finish_reason=finish_reason,
            logprobs=completion_logprobs(logprobs, self.token_text, offset))])

    def prompt_chunk(self, u: Update):
        """A completion's echoed prompt with its logprobs, streamed once they are known."""
        text, lp = echoed(self.echo[u.index], u.prompt_logprobs, "", (), self.token_text, self.decode)
        return Completion(**self._envelope(), choices=[CompletionChoice(index=u.index, text=text, finish_reason=None,
                                                                        logprobs=lp)])

    def final_chunk(self, u: Update):
        """A chat reply whose calls are read back, streamed as one delta once it is done: its
        tool_calls (or its text, where it made none), the finish reason and every logprob."""
        c = self._choice(u)
        calls = [ToolCallDelta(index=i, **t.model_dump()) for i, t in enumerate(c.message.tool_calls or ())]
        return ChatCompletionChunk(**self._envelope(), choices=[ChatChunkChoice(
            index=u.index, delta=ChatDelta(content=c.message.content, tool_calls=calls or None),
            finish_reason=c.finish_reason, logprobs=c.logprobs)])

    def _choice(self, u: Update) -> ChatChoice:
        content, calls = (u.text, None) if self.calls is None else self.calls(u.text, u.finish_reason == "stop")
        return ChatChoice(index=u.index, message=AssistantMessage(content=content, tool_calls=calls),
                          finish_reason="tool_calls" if calls else u.finish_reason,
                          logprobs=chat_logprobs(u.logprobs, self.token_text))

    def usage_chunk(self, usage: Usage):
        cls = ChatCompletionChunk if self.kind == "chat" else Completion
        return cls(**self._envelope(), choices=[], usage=usage)

    def response(self, finals: list[Update], usage: Usage):
        if self.kind == "chat":
            return ChatCompletion(**self._envelope(), usage=usage, choices=[self._choice(u) for u in finals])
        return Completion(**self._envelope(), usage=usage, choices=[CompletionChoice(
            index=u.index, finish_reason=u.finish_reason,
            **dict(zip(("text", "logprobs"), echoed(self.echo[u.index], u.prompt_logprobs, u.text, u.logprobs,
                                                  self.token_text, self.decode) if self.echo else
                       (u.text, completion_logprobs(u.logprobs, self.token_text))))) for u in finals])


def usage(prompt_tokens: int, finals: list[Update]) -> Usage:
    completion = sum(u.num_tokens for u in finals)
    taus = [t for u in finals if u.metrics for t in u.metrics.accept_lengths]
    hist = tau_histogram(taus, max((u.block_size for u in finals if u.metrics), default=1))
    budgets = [n for u in finals if u.metrics for n in u.metrics.budgets]
    predicted = [p for u in finals if u.metrics for p in u.metrics.predicted_taus]
    spec = SpecUsage(rounds=len(taus), mean_accept_length=sum(taus) / len(taus) if taus else 0.0,
                     accept_length_histogram=hist, topk=finals[0].topk if finals else None,
                     budget_histogram={str(n): budgets.count(n) for n in sorted(set(budgets))} if budgets else None,
                     mean_predicted_accept_length=sum(predicted) / len(predicted) if predicted else None)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                 total_tokens=prompt_tokens + completion, spec=spec)
