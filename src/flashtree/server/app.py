"""The OpenAI-compatible HTTP server (FastAPI + uvicorn); `commands/serve.py` runs it as `flashtree serve`.

Routes: POST /v1/chat/completions and /v1/completions (JSON or SSE stream), GET /v1/models,
/health and /metrics. A handler validates the request, tokenises it, hands its choices to the
engine loop (async_engine.py) and turns the loop's updates into OpenAI responses or stream
chunks. Every error is OpenAI error JSON; a client that disconnects has its requests aborted.
The wire schemas are protocol.py; decoding is the engine's; limits are limits.py.

Defences (each a decision, each tested): bodies over the limit get 413 before parsing; only JSON
bodies are read (a web page cannot drive the server with a text/plain or form POST); on a
loopback bind only loopback Host headers are served (DNS rebinding); with an API key everything
but /health needs it (scheme matched case-insensitively); prompts are length-checked before
tokenising and tokenised off the event loop; a request's total work and the queue are bounded
(503 + Retry-After); connections must send headers and body in time; SIGTERM drains with a
deadline (`Server`); a broken engine makes /health 503 and the process exit non-zero.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import QueueFullError, RequestError
from .async_engine import (
    SHUTTING_DOWN,
    AsyncEngine,
    Channel,
    EngineStopped,
    ShuttingDown,
    Submission,
    TextDelta,
    Update,
)
from .limits import ServerLimits
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics
from .protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionLogprobs,
    CompletionRequest,
    ModelCard,
    ModelList,
    describe,
    parse_request,
)
from .replies import Format, usage
from .tools import call_format, read_calls

log = logging.getLogger("flashtree.server")


class OpenAIServer:
    """The state behind the routes: the model, its engine loop, metrics and settings."""

    def __init__(self, llm, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None,
                 allowed_hosts: list[str] | None = None, on_fatal=None, log_interval_s: float | None = 10.0):
        self.llm, self.model_name, self.api_key = llm, model_name, api_key
        self.tokenizer, self.max_model_len = llm.tokenizer, llm.engine.max_model_len
        self.limits = (limits or ServerLimits()).resolved(self.max_model_len)
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.metrics = ServerMetrics(max_block_size=max(llm.engine.drafter_block_size, 1))
        self.tokenizing = Tokenizing(llm.tokenizer, llm.model_path)
        self.engine = AsyncEngine(llm, self.metrics, self.limits, on_fatal, log_interval_s)
        self.created = int(time.time())

    # ---------------------------------------------------------------- request -> submission
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.api_key.encode())
        if not ok:
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", type="authentication_error")

    def check_host(self, request: Request) -> None:
        """Serve only the Host names allowed (loopback names on a loopback bind): a web page on
        another origin that rebinds its DNS name to 127.0.0.1 is refused. (Starlette's
        TrustedHostMiddleware makes the same check but answers a plain-text "Invalid host header";
        a client here gets the OpenAI error body naming the names that are allowed.)"""
        if self.allowed_hosts is None:
            return
        host = request.headers.get("host", "")
        name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
        if name.lower() not in self.allowed_hosts:
            raise APIError(400, f"the Host header {_clip(host)!r} is not served here; allowed: "
                                f"{', '.join(sorted(self.allowed_hosts))} (flashtree serve --allowed-hosts)",
                           code="invalid_host")

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model '{_clip(model)}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    async def read_body(self, request: Request) -> bytes:
        """The JSON body, at most limits.max_body_bytes, received within limits.body_timeout_s."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json" and not ctype.endswith("+json"):
            raise APIError(415, f"the request body must be JSON: send 'Content-Type: application/json' "
                                f"(got {_clip(ctype) or 'none'!r})", code="unsupported_media_type")
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the request body has {declared} bytes; at most {limit} are accepted",
                           code="request_too_large")

        async def receive() -> bytes:
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
            return bytes(body)
        try:
            return await asyncio.wait_for(receive(), self.limits.body_timeout_s)
        except TimeoutError:
            raise APIError(408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                           code="request_timeout") from None

    def check_prompt_size(self, text: str, param: str) -> None:
        """Refuse a text that cannot fit the context before spending time tokenising it."""
        if self.tokenizer.min_tokens(text) >= self.max_model_len:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens, and the "
                                f"{param} is {len(text)} characters long (more than that many tokens)",
                           param=param, code="context_length_exceeded")

    async def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if not req.messages:
            raise APIError(400, "messages must be a non-empty list", param="messages")
        messages = [m.for_template() for m in req.messages]
        tools = req.template_tools(self.tokenizer.renders_tools)
        size = sum(len(m["content"]) for m in messages) + len(json.dumps(tools or []))
        self.check_prompt_size("".join(m["content"] for m in messages), "messages")
        try:
            return await self.tokenizing.run("chat", (messages, tools), size)
        except Exception as e:  # a template may raise anything (jinja errors, raise_exception)
            raise APIError(400, f"the chat template could not render these messages: {e}", param="messages") from None

    async def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        prompts = req.prompts()
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        V = self.llm.target.config.vocab_size
        texts = [p for p in prompts if isinstance(p, str)]
        for p in prompts:
            if isinstance(p, list) and any(not 0 <= t < V for t in p):
                raise APIError(400, f"prompt token ids must be in [0, {V})", param="prompt")
            if isinstance(p, str):
                self.check_prompt_size(p, "prompt")
        encoded = iter(await self.tokenizing.run("text", texts, sum(map(len, texts))) if texts else [])
        return [next(encoded) if isinstance(p, str) else list(p) for p in prompts]

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
        work = sum(len(p) + sp.max_tokens for p, sp in zip(sub.prompts, sub.params))
        if work > self.limits.max_request_tokens:
            raise APIError(400, f"this request asks for {work} tokens of work (n x (prompt + max_tokens)); at most "
                                f"{self.limits.max_request_tokens} are allowed per request: lower n or max_tokens",
                           param="n" if req.choices > 1 else "max_tokens", code="request_too_large")
        if req.speculative is not None:
            spec = req.speculative
            sub.method, sub.budget, sub.block_size, sub.topk = spec.method, spec.budget, spec.block_size, spec.topk
            sub.options = spec.options()
        return sub

    async def submit(self, sub: Submission, field_of=lambda param: param) -> Channel:
        if not self.engine.alive:
            raise APIError(503, "the engine loop is not running", code="engine_dead")
        try:
            return await self.engine.submit(sub)
        except QueueFullError as e:
            raise APIError(503, f"the server is busy: {e}; retry later", code="queue_full",
                           type="server_overloaded", retry_after=self.limits.retry_after_s) from None
        except ShuttingDown as e:
            raise APIError(503, str(e), code="shutting_down", type="server_overloaded") from None
        except EngineStopped as e:
            raise APIError(503, f"the engine loop is not running: {e}", code="engine_dead") from None
        except RequestError as e:  # the engine's checks (method, budget, block_size, top_k, prompt, grammar)
            raise APIError(400, str(e), param=field_of(e.param)) from None

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
            done, _ = await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiter.done():
                waiter.cancel()
                self.engine.abort(channel)
        return waiter.result() if waiter in done else None

    async def stream(self, channel: Channel, n: int, stop: list[str] | None, fmt: Format, usage_of,
                     echo_logprobs: bool = False):
        """SSE events: per-choice text deltas, finish reasons, optional usage, then [DONE]."""
        deltas = [TextDelta(stop) for _ in range(n)]
        finals: list[Update | None] = [None] * n
        pending: list[list] = [[] for _ in range(n)]  # logprobs not sent yet: a chunk carries its tokens'
        sent, chars = [0] * n, [0] * n  # entries sent, and the characters of their tokens' texts
        try:
            for i in range(n):
                if (head := fmt.head(i)) is not None:
                    yield _sse(head)
                if fmt.echo and not echo_logprobs:  # the prompt first (with logprobs: once they are known)
                    yield _sse(fmt.chunk(i, self.tokenizer.decode(fmt.echo[i]), None))
            while None in finals:
                u = await channel.get()
                if u.finish_reason in ("error", "timeout"):
                    yield _sse_json(_early_end(u, self.limits.retry_after_s).body())
                    return
                done = u.finish_reason is not None
                if echo_logprobs and u.prompt_logprobs and not chars[u.index]:
                    chunk = fmt.prompt_chunk(u)
                    yield _sse(chunk)
                    chars[u.index] = len(chunk.choices[0].text)  # where the completion's token texts start
                if fmt.calls is not None:  # calls are read from the whole reply: it goes out in one delta
                    if done:
                        finals[u.index] = u
                        yield _sse(fmt.final_chunk(u))
                    continue
                text = deltas[u.index].push(u.text, done)
                pending[u.index] = list(u.logprobs[sent[u.index]:]) if done else pending[u.index] + list(u.logprobs)
                if done:
                    finals[u.index] = u
                if text or done:
                    chunk = fmt.chunk(u.index, text, u.finish_reason, pending[u.index], chars[u.index])
                    yield _sse(chunk)
                    sent[u.index] += len(pending[u.index])
                    pending[u.index] = []
                    lp = chunk.choices[0].logprobs
                    if isinstance(lp, CompletionLogprobs):  # where the next chunk's token texts start
                        chars[u.index] = lp.text_offset[-1] + len(lp.tokens[-1])
            if usage_of is not None:
                yield _sse(fmt.usage_chunk(usage_of(finals)))
            yield "data: [DONE]\n\n"
        finally:
            if None in finals:  # client gone (or loop error): free the slots now
                self.engine.abort(channel)

    async def serve(self, request: Request, kind: str):
        cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
        req = parse_request(cls, await self.read_body(request))
        self.check_model(req.model)
        if kind == "chat":
            prompts, param = [await self.chat_prompt(req)], "messages"
        else:
            prompts, param = await self.completion_prompts(req), "prompt"
        sub = self.submission(req, prompts, param)
        mode = req.tool_mode() if kind == "chat" else None
        calls_as = call_format(self.tokenizer.chat_template)  # (a reply whose calls are not read back streams as text)
        calls = None if mode in (None, "none") or (mode == "auto" and calls_as is None) else \
            (lambda text, done: read_calls(text, mode, calls_as, done))
        fmt = Format(kind, self.model_name, lambda t: self.tokenizer.decode([t]), calls,
                      sub.prompts if getattr(req, "echo", None) else None, self.tokenizer.decode)
        channel = await self.submit(sub, req.field_of)
        n = len(sub.prompts)
        prompt_tokens = sum(len(p) for p in prompts)
        usage_of = lambda finals: usage(prompt_tokens, finals)
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(self.stream(channel, n, sub.params[0].stop, fmt, usage_of if include else None,
                                                 sub.params[0].prompt_logprobs is not None),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finals = await self.collect(request, channel, n)
        if finals is None:
            self.metrics.rejected.labels("499").inc()
            return Response(status_code=499)  # nobody is listening
        for u in finals:
            if u.finish_reason in ("error", "timeout") or (u.finish_reason == "abort" and u.error):
                raise _early_end(u, self.limits.retry_after_s)
        return JSONResponse(fmt.response(finals, usage_of(finals)).model_dump())


class Tokenizing:
    """Tokenises request texts off the event loop: in a thread, or — over BIG characters — in a
    worker process of its own, because the tokenizer may hold the interpreter (the GIL) for the
    whole of a huge input and stall every stream and /health with it (seen: 6 s for 6 MB)."""
    BIG = 1 << 16

    def __init__(self, tokenizer, path):
        self.tokenizer, self.path, self.pool = tokenizer, str(path), None

    async def run(self, kind: str, payload, size: int):
        """kind "chat": payload = messages -> ids; kind "text": payload = [str] -> [ids]."""
        if size <= self.BIG:
            return await asyncio.to_thread(_encode, self.tokenizer, kind, payload)
        if self.pool is None:  # spawned on first use: a fork of this threaded process is unsafe
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_load_worker_tokenizer, initargs=(self.path,))
        return await asyncio.get_running_loop().run_in_executor(self.pool, _encode_in_worker, kind, payload)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _encode(tokenizer, kind: str, payload):
    """Special-token strings typed by users are text (Tokenizer.encode_chat / special=False)."""
    if kind == "chat":
        return tokenizer.encode_chat(*payload)  # (messages, tools)
    return [tokenizer.encode(t, special=False) for t in payload]


_WORKER_TOKENIZER = None


def _load_worker_tokenizer(path: str) -> None:
    global _WORKER_TOKENIZER
    from ..tokenizer import Tokenizer
    _WORKER_TOKENIZER = Tokenizer(path)
    parent = os.getppid()

    def orphaned():  # the server was killed: do not outlive it
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)
    threading.Thread(target=orphaned, daemon=True).start()


def _encode_in_worker(kind: str, payload):
    return _encode(_WORKER_TOKENIZER, kind, payload)


def _early_end(u: Update, retry_after_s: int) -> APIError:
    """The error answered for a choice that ended without finishing."""
    if u.finish_reason == "timeout":
        return APIError(503, f"the server is busy: {u.error}; retry later", code="queue_timeout",
                        type="server_overloaded", retry_after=retry_after_s)
    if u.finish_reason == "abort":
        return APIError(503, u.error or "the request was aborted", code="shutting_down", type="server_overloaded")
    return APIError(500, f"this request failed in the engine ({u.error or 'see the server log'}); other requests "
                         "are not affected", code="engine_error")


def _clip(text: str, n: int = 64) -> str:
    """A client-supplied string, cut so that errors never echo a huge value back."""
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


def _sse(model) -> str:
    return f"data: {model.model_dump_json()}\n\n"


def _sse_json(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (call after the body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(llm, model_name: str = "flashtree", api_key: str | None = None,
               limits: ServerLimits | None = None, allowed_hosts: list[str] | None = None,
               on_fatal=None, log_interval_s: float | None = 10.0) -> FastAPI:
    """A FastAPI app serving `llm`; its engine loop runs while the app's lifespan is active.

    allowed_hosts: Host names served (None: any); on_fatal: called from the engine thread if the
    engine breaks for good (the CLI stops the process with a non-zero exit); log_interval_s: the
    decode-batch line's period while there is work (None or 0: never)."""
    server = OpenAIServer(llm, model_name, api_key, limits, allowed_hosts, on_fatal, log_interval_s)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.engine.start()
        if llm.engine.grammars is not None:  # xgrammar's import and vocabulary, off the engine thread
            threading.Thread(target=llm.engine.grammars.prepare, daemon=True, name="grammars").start()
        yield
        server.engine.shutdown()
        server.tokenizing.close()

    app = FastAPI(title="flashtree", lifespan=lifespan)
    app.state.server = server

    def error(e: APIError) -> JSONResponse:
        server.metrics.rejected.labels(str(e.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}
        return JSONResponse(e.body(), status_code=e.status, headers={**headers, **e.headers})

    @app.middleware("http")
    async def gate(request: Request, call_next):
        """Host check, then the API key on everything but /health."""
        try:
            server.check_host(request)
            if request.url.path != "/health":
                server.check_auth(request)
        except APIError as e:
            return error(e)
        return await call_next(request)

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
        return error(APIError(e.status_code, str(e.detail), code=str(e.status_code), headers=e.headers))

    @app.exception_handler(Exception)
    async def _internal_error(request, e: Exception):
        log.exception("unhandled error")
        return error(APIError(500, f"internal server error: {type(e).__name__}: {e}"))

    def openapi():  # FastAPI's documented hook for extending the schema
        if app.openapi_schema is None:
            app.openapi_schema = describe(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema
    app.openapi = openapi

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.serve(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.serve(request, "text")

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[_card(server)]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        server.check_model(model_id)
        return _card(server).model_dump()

    @app.get("/health")
    async def health():
        if not server.engine.alive:
            why = f": {server.engine.failure}" if server.engine.failure else ""
            return error(APIError(503, f"the engine loop is not running{why}", code="engine_dead"))
        if server.engine.draining:
            return error(APIError(503, SHUTTING_DOWN, code="shutting_down"))
        return {"status": "ok", **server.engine.kv_usage(), "graphs_compiling": server.engine.graphs_compiling()}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a request's headers within
    `header_timeout` seconds of connecting or of its previous response (slowloris)."""
    header_timeout = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        self.responses = getattr(self, "responses", -1) + 1  # responses completed on this connection
        self.loop.call_later(self.header_timeout, self._expire, self.responses)

    def _expire(self, armed_at: int) -> None:
        idle = self.cycle is None or self.cycle.response_complete  # no request in progress
        if idle and self.responses == armed_at and not self.transport.is_closing():
            self.transport.close()


class Server(uvicorn.Server):
    """uvicorn with flashtree's shutdown: the first SIGTERM/SIGINT stops admission and gives running
    requests `shutdown_timeout_s` to finish (then they end with a final chunk); a second one exits now."""

    def __init__(self, config: uvicorn.Config, app_server: OpenAIServer):
        super().__init__(config)
        self.app_server = app_server

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:
            self.force_exit = True
            return
        log.info("received %s: no new requests; running ones get %.0f s", signal.Signals(sig).name,
                 self.app_server.limits.shutdown_timeout_s)
        self.app_server.engine.drain(self.app_server.limits.shutdown_timeout_s)
        super().handle_exit(sig, frame)


def _card(server: OpenAIServer) -> ModelCard:
    return ModelCard(id=server.model_name, created=server.created, max_model_len=server.max_model_len)
