"""`flashtree serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn).

Routes: POST /v1/chat/completions and /v1/completions (JSON or SSE stream), GET /v1/models,
/health and /metrics. A handler validates the request, tokenises it, hands its choices to the
engine loop (async_engine.py) and turns the loop's updates into OpenAI responses or stream
chunks. Every error is OpenAI error JSON; a client that disconnects has its requests aborted.
The wire schemas are protocol.py; decoding is the engine's.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.engine import QueueFullError
from .async_engine import AsyncEngine, Channel, Submission, TextDelta, Update
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics
from .protocol import (APIError, AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion,
                       ChatCompletionChunk, ChatCompletionRequest, ChatDelta, Completion, CompletionChoice,
                       CompletionRequest, ModelCard, ModelList, SpecUsage, Usage, parse_request)

log = logging.getLogger("flashtree.server")


class OpenAIServer:
    """The state behind the routes: the model, its engine loop, metrics and settings."""

    def __init__(self, llm, model_name: str, api_key: str | None = None):
        self.llm, self.model_name, self.api_key = llm, model_name, api_key
        self.tokenizer, self.max_model_len = llm.tokenizer, llm.engine.max_model_len
        self.metrics = ServerMetrics(max_block_size=max(llm.engine.drafter_block_size, 1))
        self.engine = AsyncEngine(llm, self.metrics)
        self.created = int(time.time())

    # ---------------------------------------------------------------- request -> submission
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", type="authentication_error")

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model '{model}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if not req.messages:
            raise APIError(400, "messages must be a non-empty list", param="messages")
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in req.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages)
        except Exception as e:  # a template may raise anything (jinja errors, raise_exception)
            raise APIError(400, f"the chat template could not render these messages: {e}", param="messages") from None
        return self.tokenizer.encode(text)

    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        prompts = req.prompts()
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        V = self.llm.target.config.vocab_size
        out = []
        for p in prompts:
            if isinstance(p, list) and any(not 0 <= t < V for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {V})", param="prompt")
            out.append(self.tokenizer.encode(p) if isinstance(p, str) else list(p))
        return out

    def submission(self, req, prompts: list[list[int]], prompt_param: str) -> Submission:
        """One engine request per (prompt, choice), with context-length checks."""
        sub = Submission([], [])
        for ids in prompts:
            if not ids:
                raise APIError(400, "the prompt is empty: at least one token is needed", param=prompt_param)
            room = self.max_model_len - len(ids)
            if room < 1:
                raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens, and "
                                    f"the prompt has {len(ids)} (at least one token must be generated)",
                               param=prompt_param, code="context_length_exceeded")
            wanted = req.requested_max_tokens
            for i in range(req.choices):
                sub.params.append(req.sampling_params(i, room if wanted is None else wanted))
                sub.prompts.append(ids)
            if wanted is not None and wanted > room:
                param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
                raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the "
                                    f"prompt has {len(ids)} and {param} asks for {wanted} more (at most {room})",
                               param=param, code="context_length_exceeded")
        if req.speculative is not None:
            sub.method, sub.budget, sub.block_size = (req.speculative.method, req.speculative.budget,
                                                      req.speculative.block_size)
        return sub

    async def submit(self, sub: Submission) -> Channel:
        if not self.engine.alive:
            raise APIError(503, "the engine loop is not running", code="engine_dead")
        try:
            return await self.engine.submit(sub)
        except QueueFullError as e:
            raise APIError(503, f"the server is busy: {e}; retry later", code="queue_full",
                           type="server_overloaded") from None
        except ValueError as e:  # the engine's checks of method / budget / block_size
            raise APIError(400, str(e), param="speculative") from None

    # ---------------------------------------------------------------- engine updates -> responses
    async def collect(self, request: Request, channel: Channel, n: int) -> list[Update] | None:
        """The final update of each choice, or None if the client disconnected first."""
        async def finals() -> list[Update]:
            out: list[Update | None] = [None] * n
            while None in out:
                u = await channel.get()
                if u.finish_reason is not None:
                    out[u.index] = u
            return out

        waiter = asyncio.ensure_future(finals())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiter.done():
                waiter.cancel()
                self.engine.abort(channel)
        return waiter.result() if not waiter.cancelled() else None

    async def stream(self, channel: Channel, n: int, stop: list[str] | None, fmt: "_Format", usage_of):
        """SSE events: per-choice text deltas, finish reasons, optional usage, then [DONE]."""
        deltas = [TextDelta(stop) for _ in range(n)]
        finals: list[Update | None] = [None] * n
        try:
            for i in range(n):
                if (head := fmt.head(i)) is not None:
                    yield _sse(head)
            while None in finals:
                u = await channel.get()
                if u.finish_reason == "error":
                    yield _sse_json(APIError(500, "the engine failed while generating; see the server log").body())
                    return
                done = u.finish_reason is not None
                text = deltas[u.index].push(u.text, done)
                if done:
                    finals[u.index] = u
                if text or done:
                    yield _sse(fmt.chunk(u.index, text, u.finish_reason))
            if usage_of is not None:
                yield _sse(fmt.usage_chunk(usage_of(finals)))
            yield "data: [DONE]\n\n"
        finally:
            if None in finals:  # client gone (or loop error): free the slots now
                self.engine.abort(channel)

    async def serve(self, request: Request, kind: str):
        cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
        req = parse_request(cls, await request.body())
        self.check_model(req.model)
        if kind == "chat":
            prompts, param = [self.chat_prompt(req)], "messages"
        else:
            prompts, param = self.completion_prompts(req), "prompt"
        sub = self.submission(req, prompts, param)
        fmt = _Format(kind, self.model_name)
        channel = await self.submit(sub)
        n = len(sub.prompts)
        prompt_tokens = sum(len(p) for p in prompts)
        usage_of = lambda finals: _usage(prompt_tokens, finals)  # noqa: E731
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(self.stream(channel, n, sub.params[0].stop, fmt, usage_of if include else None),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finals = await self.collect(request, channel, n)
        if finals is None:
            return Response(status_code=499)  # nobody is listening
        if any(u.finish_reason == "error" for u in finals):
            raise APIError(500, "the engine failed while generating; see the server log")
        return JSONResponse(fmt.response(finals, usage_of(finals)).model_dump())


class _Format:
    """OpenAI response and chunk shapes of one endpoint ("chat" or "text")."""
    __slots__ = ("kind", "model", "id", "created")

    def __init__(self, kind: str, model: str):
        self.kind, self.model, self.created = kind, model, int(time.time())
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex

    def _envelope(self):
        return dict(id=self.id, created=self.created, model=self.model)

    def head(self, index: int):
        if self.kind != "chat":
            return None
        return ChatCompletionChunk(**self._envelope(), choices=[ChatChunkChoice(
            index=index, delta=ChatDelta(role="assistant", content=""))])

    def chunk(self, index: int, text: str, finish_reason: str | None):
        if self.kind == "chat":
            return ChatCompletionChunk(**self._envelope(), choices=[ChatChunkChoice(
                index=index, delta=ChatDelta(content=text or None), finish_reason=finish_reason)])
        return Completion(**self._envelope(), choices=[CompletionChoice(index=index, text=text,
                                                                        finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage):
        cls = ChatCompletionChunk if self.kind == "chat" else Completion
        return cls(**self._envelope(), choices=[], usage=usage)

    def response(self, finals: list[Update], usage: Usage):
        if self.kind == "chat":
            return ChatCompletion(**self._envelope(), usage=usage, choices=[ChatChoice(
                index=u.index, message=AssistantMessage(content=u.text), finish_reason=u.finish_reason)
                for u in finals])
        return Completion(**self._envelope(), usage=usage, choices=[CompletionChoice(
            index=u.index, text=u.text, finish_reason=u.finish_reason) for u in finals])


def _usage(prompt_tokens: int, finals: list[Update]) -> Usage:
    completion = sum(u.num_tokens for u in finals)
    taus = [t for u in finals if u.metrics for t in u.metrics.accept_lengths]
    hist: list[int] = []
    for u in finals:
        if u.metrics:
            h = u.metrics.histogram(u.block_size)
            hist += [0] * (len(h) - len(hist))
            for i, c in enumerate(h):
                hist[i] += c
    spec = SpecUsage(rounds=len(taus), mean_accept_length=sum(taus) / len(taus) if taus else 0.0,
                     accept_length_histogram=hist)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                 total_tokens=prompt_tokens + completion, spec=spec)


def _sse(model) -> str:
    return f"data: {model.model_dump_json()}\n\n"


def _sse_json(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (call after the body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(llm, model_name: str = "flashtree", api_key: str | None = None) -> FastAPI:
    """A FastAPI app serving `llm`; its engine loop runs while the app's lifespan is active."""
    server = OpenAIServer(llm, model_name, api_key)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        yield
        server.engine.shutdown()

    app = FastAPI(title="flashtree", lifespan=lifespan)
    app.state.server = server
    auth = [Depends(server.check_auth)]

    def error(e: APIError) -> JSONResponse:
        server.metrics.rejected.labels(str(e.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return error(e)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e: RequestValidationError):
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())[1:]) or None
        return error(APIError(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), param=loc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e: StarletteHTTPException):
        return error(APIError(e.status_code, str(e.detail), code=str(e.status_code)))

    @app.exception_handler(Exception)
    async def _internal_error(request, e: Exception):
        log.exception("unhandled error")
        return error(APIError(500, f"internal server error: {type(e).__name__}: {e}"))

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        return await server.serve(request, "chat")

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        return await server.serve(request, "text")

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return ModelList(data=[_card(server)]).model_dump()

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def model(model_id: str):
        server.check_model(model_id)
        return _card(server).model_dump()

    @app.get("/health")
    async def health():
        if not server.engine.alive:
            return error(APIError(503, "the engine loop is not running", code="engine_dead"))
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def _card(server: OpenAIServer) -> ModelCard:
    return ModelCard(id=server.model_name, created=server.created, max_model_len=server.max_model_len)


# -------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    from ..commands.generate import add_model_arguments
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--api-key", default=os.environ.get("FLASHTREE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $FLASHTREE_API_KEY, else none)")
    p.add_argument("--max-batch-size", type=int, default=8, help="requests per round (KV cache slots; default 8)")
    p.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 503 (default 1024)")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the --model directory name, or 'flashtree')")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def run(args) -> int:
    import uvicorn

    from ..commands.generate import load_llm
    if args.max_queue < 1:
        raise ValueError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    llm = load_llm(args, max_batch_size=args.max_batch_size, max_model_len=args.max_model_len,
                   max_queue=args.max_queue)
    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model)) if args.model else "flashtree")
    app = create_app(llm, model_name=name, api_key=args.api_key or None)
    log.info("serving '%s' (%s) on http://%s:%d", name, args.method, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
