"""`serve ENGINE [--host 127.0.0.1 --port 8000]`: the OpenAI-compatible server (app.py) on uvicorn, with the
scheduler thread (scheduler.py) owning the engine. The engine loads and the port is bound before the server
starts, so a bad engine folder or a busy port is the usual one-line error."""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.serve.scheduler import DEFAULT_PREFILL_CHUNK
from fdpp_rewrite.serve.warmup import MODES

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
    parser.add_argument("--backend", choices=["cuda", "cpu"], help="default: the engine's")
    parser.add_argument("--warmup", choices=MODES, default="decode",
                        help="shapes traced before the server is healthy: every decode bucket (decode), also every "
                             "prefill chunk shape (all), or none (the first request of a shape traces it)")


def check_options(args) -> None:
    if not 0 <= args.port <= 65535:
        raise FdppError(f"--port must be in 0..65535, got {args.port}")
    for name in ("max_queue", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise FdppError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.request_timeout <= 0:
        raise FdppError(f"--request-timeout must be positive, got {args.request_timeout}")


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


def build_app(engine, *, model_name: str | None = None, max_queue: int = 64, request_timeout: float = 600.0,
              prefill_chunk: int = DEFAULT_PREFILL_CHUNK, warmup: str = "none"):
    """The FastAPI app and its scheduler for a loaded engine (the scheduler starts with the app, and warms the
    engine up first unless warmup is "none")."""
    from fdpp_rewrite.serve.app import create_app
    from fdpp_rewrite.serve.scheduler import Scheduler

    tokenizer = engine_tokenizer(engine)
    stop_ids = {tokenizer.eos_id} if tokenizer is not None and tokenizer.eos_id is not None else set()
    scheduler = Scheduler(engine, tokenizer, max_queue=max_queue, prefill_chunk=prefill_chunk, stop_ids=stop_ids,
                          warmup=warmup)
    return create_app(scheduler, tokenizer, model_name or engine.folder.name, request_timeout), scheduler


def run(args) -> int:
    check_options(args)
    import uvicorn

    from fdpp_rewrite.engine.runtime import Engine

    sock = bind(args.host, args.port)
    engine = Engine(args.engine, backend=args.backend)
    app, scheduler = build_app(engine, model_name=args.model_name, max_queue=args.max_queue,
                               request_timeout=args.request_timeout, prefill_chunk=args.prefill_chunk,
                               warmup=args.warmup)
    host, port = sock.getsockname()[:2]
    gc.collect()
    gc.freeze()  # the engine, torch and the app live as long as the server: later collections skip their objects
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    print(f"serving {args.model_name or engine.folder.name} at http://{host}:{port}/v1 ({engine.backend.name} "
          f"backend, {engine.max_batch} KV slots, max sequence {engine.max_seq}); Ctrl-C stops", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    server.run(sockets=[sock])
    return 0
