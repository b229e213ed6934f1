"""`flashtree serve`: the OpenAI-compatible HTTP server on a loaded model (server/app.py builds the
app; this module reads the command line, loads the model, binds uvicorn and exits 1 if the engine
broke so a supervisor restarts it)."""
from __future__ import annotations

import logging
import os

from .. import switches
from ..engine.engine_config import default
from ..errors import UserError
from ..server.limits import ServerLimits
from ..server.logs import LOG_FORMATS, configure_logging
from ..speculative.proposer import proposer_class

log = logging.getLogger("flashtree.server")
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1"]


def add_arguments(p) -> None:
    from ..commands.generate import add_model_arguments
    add_model_arguments(p)
    d = ServerLimits()
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on everything but /health (default: "
                        "$FLASHTREE_API_KEY, else none); prefer the variable: arguments are visible in ps")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host names served (default: loopback names on a loopback bind, else any)")
    p.add_argument("--max-batch-size", type=int, default=default("max_batch_size"),
                   help=f"requests per round (KV cache slots; default {default('max_batch_size')})")
    p.add_argument("--max-queue", type=int, default=default("max_queue"),
                   help=f"waiting requests before 503 (default {default('max_queue')})")
    p.add_argument("--max-model-len", type=int, default=None, help="context limit (default: the model's)")
    p.add_argument("--max-body-size", type=int, default=d.max_body_bytes,
                   help=f"largest request body in bytes, else 413 (default {d.max_body_bytes})")
    p.add_argument("--max-request-tokens", type=int, default=None,
                   help="most n x (prompt + max_tokens) per request, else 400 (default: 8 x the context)")
    p.add_argument("--max-queued-tokens", type=int, default=None,
                   help="most prompt + max_tokens summed over waiting requests, else 503 (default: 64 x the context)")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s,
                   help=f"seconds a request may wait for a slot, else 503 (default {d.queue_timeout_s:g})")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                   help=f"seconds a connection has to send its request headers (default {d.header_timeout_s:g})")
    p.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout_s,
                   help=f"on SIGTERM, seconds running requests get before they are ended (default {d.shutdown_timeout_s:g})")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the --model directory name, or 'flashtree')")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-interval", type=float, default=10.0,
                   help="seconds between decode-batch log lines while there is work: running/waiting requests, "
                        "KV use, accept len and gen throughput over the interval (default 10; 0 = off)")
    p.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                   help="text, or json: one JSON object per line, for log shippers (default text)")


def run(args, llm=None) -> int:
    """`flashtree serve`. Returns 0 after a clean shutdown, 1 if the engine broke.
    `llm`: serve this already loaded LLM instead of loading the one `args` name."""
    # The HTTP stack loads here, not at import: every other command (bench, generate, chat) works on a
    # machine without fastapi/uvicorn, such as a GPU image that has torch alone.
    import uvicorn

    from ..commands.generate import load_llm
    from ..server.app import HeaderTimeoutProtocol, Server, create_app
    if args.max_queue < 1:
        raise UserError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    if not args.log_interval >= 0:  # also refuses nan
        raise UserError(f"--log-interval must be >= 0 seconds (0 = no decode-batch lines), got {args.log_interval}")
    limits = ServerLimits(max_body_bytes=args.max_body_size, max_request_tokens=args.max_request_tokens,
                          max_queued_tokens=args.max_queued_tokens, queue_timeout_s=args.queue_timeout,
                          header_timeout_s=args.header_timeout, shutdown_timeout_s=args.shutdown_timeout)
    configure_logging(args.log_level, args.log_format)
    api_key = args.api_key or switches.value("FLASHTREE_API_KEY") or None
    if args.api_key:
        log.warning("--api-key is visible to every user of this machine (ps); set FLASHTREE_API_KEY instead")
    if args.allowed_hosts:
        allowed = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    else:
        allowed = LOOPBACK_NAMES + [args.host] if args.host in LOOPBACK_NAMES else None
    if llm is None:
        llm = load_llm(args, precompile="background", max_batch_size=args.max_batch_size, max_model_len=args.max_model_len,
                       max_queue=args.max_queue)
    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model)) if args.model else "flashtree")
    exit_code = 0

    def on_fatal():  # engine thread: stop serving; a supervisor restarts the process
        nonlocal exit_code
        exit_code = 1
        server.should_exit = True
    app = create_app(llm, model_name=name, api_key=api_key, limits=limits, allowed_hosts=allowed, on_fatal=on_fatal,
                     log_interval_s=args.log_interval or None)
    protocol = type("Protocol", (HeaderTimeoutProtocol,), {"header_timeout": limits.header_timeout_s})
    # json: uvicorn's own records go through the root handler too (its default config prints text)
    log_config = None if args.log_format == "json" else uvicorn.config.LOGGING_CONFIG
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, http=protocol,
                            timeout_graceful_shutdown=limits.shutdown_timeout_s + 5, log_config=log_config)
    server = Server(config, app.state.server)
    eng = llm.engine
    shape = f", budget {eng.limits.default_budget}, topk {eng.limits.default_topk or 'no cap'}" \
        if "budget" in proposer_class(args.method).options else ""
    log.info("serving '%s' (%s%s) on http://%s:%d; decode-batch line every %s", name, args.method, shape,
             args.host, args.port, f"{args.log_interval:g} s" if args.log_interval else "- (off)")
    server.run()
    if exit_code:
        log.critical("exiting with status 1: %s", app.state.server.engine.failure)
    return exit_code
