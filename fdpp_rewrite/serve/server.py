"""`serve ENGINE [--host 127.0.0.1 --port 8000]`: the OpenAI-compatible server (app.py) on uvicorn, with the
scheduler thread (scheduler.py) owning the engine, guard.py in front (API key, body limits) and protocol.py under
it (connection limits). The engine loads and the port is bound before the server starts, so a bad engine folder
or a busy port is the usual one-line error. SIGINT or SIGTERM drains: every path but /metrics answers 503, the requests
in flight end with an error (a stream with an error event), then the server stops."""

from __future__ import annotations

import gc
import ipaddress
import math
import os
import socket
import sys
from dataclasses import fields
from pathlib import Path

from fdpp_rewrite.cli_args import add_engine_backend, add_kv_memory
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.serve.guard import API_KEY_ENV
from fdpp_rewrite.serve.limits import MAX_HEADER_BYTES, Limits
from fdpp_rewrite.serve.scheduler import DEFAULT_PREFILL_BUDGET, DEFAULT_PREFILL_CHUNK

from fdpp_rewrite.serve.warmup import MODES

PAGED_OPTIONS = ("prefill_budget", "max_batch", "no_prefix_cache")  # only a paged engine takes them

# seconds uvicorn waits, once the requests in flight were ended (drain), for their responses to be written
GRACEFUL_SHUTDOWN_S = 5
LIMIT_HELP = {
    "max_body_mb": "request body size in MiB; past it, 413 before the body is read",
    "header_timeout": "seconds a connection may take, from its first byte, to send a request's headers; past it, "
                      "408 and closed",
    "body_timeout": "seconds a request may take to send its body once its headers are in; past it, 408 and closed",
    "keep_alive_timeout": "seconds an idle kept-alive connection stays open between two requests",
    "max_connections": "connections open at once; past it, a new one gets 503 and is closed",
}

# Two threads share the GIL: the scheduler, which must launch the next step within one step time, and the event
# loop streaming the last step's tokens. A thread that asks for the GIL waits up to this interval before the holder
# is made to let go; CPython's 5 ms default is about a whole decode step.
GIL_SWITCH_INTERVAL_S = 0.0005


def add_arguments(parser) -> None:
    parser.add_argument("engine", type=Path, help="an engine folder written by `build`")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    parser.add_argument("--model-name", help="the model id clients name (default: the engine folder's name)")
    parser.add_argument("--max-queue", type=int, default=64,
                        help="requests that may wait for a KV slot; past that, 503 with Retry-After")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a request may take, queueing included; past that, 504 (or an error event)")
    parser.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                        help="prompt tokens prefilled per step, riding on the decode step where the engine can "
                             f"(a long prompt takes several; default {DEFAULT_PREFILL_CHUNK})")
    add_kv_memory(parser)
    parser.add_argument("--prefill-budget", type=int,
                        help="paged engines: prompt tokens one step carries, over the chunks of several prompts "
                             f"(each chunk --prefill-chunk tokens at most, counted padded; at most what the engine "
                             f"captures a step for; default {DEFAULT_PREFILL_BUDGET})")
    parser.add_argument("--max-batch", type=int,
                        help="paged engines: sequences running at once (default: the engine's rows, up to 256)")
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="paged engines: do not share the KV blocks of identical prompt prefixes")
    add_engine_backend(parser)
    parser.add_argument("--warmup", choices=MODES, default="decode",
                        help="shapes traced before the server is healthy: every decode bucket (decode), also every "
                             "prefill chunk shape (all), or none (the first request of a shape traces it)")
    parser.add_argument("--api-key", help=f"every request but /health and /metrics must send `Authorization: Bearer "
                                          f"KEY` (default: ${API_KEY_ENV}; neither set: no key needed)")
    for field in fields(Limits):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=int if field.type == "int" else float,
                            default=field.default, help=f"{LIMIT_HELP[field.name]} (default {field.default:g})")


def check_options(args) -> None:
    if not 0 <= args.port <= 65535:
        raise FdppError(f"--port must be in 0..65535, got {args.port}")
    for name in ("max_queue", "prefill_chunk", "prefill_budget", "max_batch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise FdppError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.kv_memory is not None:
        from fdpp_rewrite.engine.paged.sizing import parse_kv_memory

        parse_kv_memory(args.kv_memory)  # a one-line error before the engine loads
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise FdppError(f"--request-timeout must be a positive number of seconds, got {args.request_timeout}")
    limits_of(args).check()


def limits_of(args) -> Limits:
    return Limits(**{field.name: getattr(args, field.name) for field in fields(Limits)})


def api_key_of(args) -> str | None:
    """--api-key, else $FDPP_API_KEY; None when neither is set (an empty value is refused)."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise FdppError(f"the API key is empty; pass --api-key KEY or unset {API_KEY_ENV}")
    return key


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The line printed at start when the server listens beyond this host with no key."""
    if api_key is not None or is_loopback(host):
        return None
    return (f"warning: listening on {host} with no API key: anyone who can reach it can use it; pass --api-key or "
            f"set {API_KEY_ENV} (docs/serving.md, Deploying)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever it resolves to
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket for uvicorn; FdppError when the address is taken or not ours."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise FdppError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port or "
                        "--host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def engine_tokenizer(engine):
    from fdpp_rewrite.tokenizer import Tokenizer

    fields = engine.manifest.get("tokenizer")
    return Tokenizer.load(engine.folder, fields) if fields else None


def load_engine(args):
    """The engine, paged with --kv-memory / --no-prefix-cache where given; FdppError when a paged-only option meets
    an engine with KV slots."""
    from fdpp_rewrite.engine.runtime import Engine

    options = {"backend": args.backend}
    if args.kv_memory is not None:
        options["kv_memory"] = args.kv_memory
    if args.no_prefix_cache:
        options["prefix_caching"] = False
    engine = Engine.load(args.engine, **options)
    given = [name for name in PAGED_OPTIONS if getattr(args, name) not in (None, False)]
    if given and not getattr(engine, "paged", False):
        raise FdppError(f"--{given[0].replace('_', '-')} applies to a paged KV cache; this engine has "
                        f"{engine.max_batch} KV slots (build it with --kv-memory, or pass serve --kv-memory)")
    return engine


def build_app(engine, *, model_name: str | None = None, max_queue: int = 64, request_timeout: float = 600.0,
              prefill_chunk: int = DEFAULT_PREFILL_CHUNK, warmup: str = "none", limits: Limits = Limits(),
              api_key: str | None = None, prefill_budget: int | None = None, max_batch: int | None = None):
    """The ASGI app (the FastAPI app behind guard.py) and its scheduler for a loaded engine (the scheduler starts
    with the app, and warms the engine up first unless warmup is "none"): the paged scheduler on a paged engine
    (prefill_budget, max_batch: its options), else the one over KV slots."""
    from fdpp_rewrite.serve.app import create_app
    from fdpp_rewrite.serve.guard import Guard
    from fdpp_rewrite.serve.scheduler import Scheduler

    tokenizer = engine_tokenizer(engine)
    stop_ids = {tokenizer.eos_id} if tokenizer is not None and tokenizer.eos_id is not None else set()
    options = dict(max_queue=max_queue, prefill_chunk=prefill_chunk, stop_ids=stop_ids, warmup=warmup)
    if getattr(engine, "paged", False):
        from fdpp_rewrite.serve.paged_scheduler import PagedScheduler

        scheduler = PagedScheduler(engine, tokenizer, prefill_budget=prefill_budget or DEFAULT_PREFILL_BUDGET,
                                   max_batch=max_batch, **options)
    else:
        scheduler = Scheduler(engine, tokenizer, **options)
    app = create_app(scheduler, tokenizer, model_name or engine.folder.name, request_timeout)
    return Guard(app, limits, scheduler, api_key), scheduler


def make_server(app, scheduler, limits: Limits):
    """The uvicorn server with protocol.py's limits; its exit handler (SIGINT, SIGTERM) drains first."""
    import uvicorn

    from fdpp_rewrite.serve.protocol import protocol_class

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            scheduler.drain()
            super().handle_exit(sig, frame)

    return Server(uvicorn.Config(app, log_level="warning", http=protocol_class(limits), ws="none", lifespan="on",
                                 timeout_keep_alive=limits.keep_alive_timeout,
                                 h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                 timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))


def capacity(engine, scheduler) -> str:
    if not getattr(engine, "paged", False):
        return f"{engine.max_batch} KV slots"
    kv = engine.kv
    return (f"{len(scheduler.slots)} sequence rows, {kv.total_blocks} KV blocks of {kv.block_size} tokens, prefix "
            f"cache {'on' if kv.prefix is not None else 'off'}")


def run(args) -> int:
    check_options(args)
    api_key, limits = api_key_of(args), limits_of(args)
    sock = bind(args.host, args.port)
    engine = load_engine(args)
    app, scheduler = build_app(engine, model_name=args.model_name, max_queue=args.max_queue,
                               request_timeout=args.request_timeout, prefill_chunk=args.prefill_chunk,
                               warmup=args.warmup, limits=limits, api_key=api_key,
                               prefill_budget=args.prefill_budget, max_batch=args.max_batch)
    host, port = sock.getsockname()[:2]
    gc.collect()
    gc.freeze()  # the engine, torch and the app live as long as the server: later collections skip their objects
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    print(f"serving {args.model_name or engine.folder.name} at http://{host}:{port}/v1 ({engine.backend.name} "
          f"backend, {capacity(engine, scheduler)}, max sequence {scheduler.sequence_limit()[0]}); Ctrl-C stops",
          file=sys.stderr)
    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    make_server(app, scheduler, limits).run(sockets=[sock])
    return 0
