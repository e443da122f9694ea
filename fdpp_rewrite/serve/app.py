"""The HTTP side: FastAPI endpoints that turn OpenAI requests into scheduler Requests and scheduler events into
OpenAI responses. Nothing here touches the engine; the event loop only queues.

    POST /v1/completions, /v1/chat/completions   stream false (one JSON) or true (server-sent events, OpenAI's
                                                 chunk format, usage on the last chunk, then `data: [DONE]`)
    GET  /v1/models, /health, /metrics           /metrics: Prometheus text (metrics.py, Scheduler.gauges)

Every refusal is OpenAI's error object: 400 for a malformed body or a bad value (the message names the field;
body.py parses and validates), 404 for another model name, 503 with Retry-After when the queue is full or the server
is still warming up, 503 once it shuts down, 504 when a request runs past the timeout, 500 when the engine failed.
guard.py, in front, refuses a missing API key (401), a body too large (413) or too slow (408). A client that
disconnects cancels its request (its slot is freed at the scheduler's next iteration).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from fdpp_rewrite.engine.runtime import Sampler
from fdpp_rewrite.serve.body import parse_body
from fdpp_rewrite.serve.chat import encode_chat
from fdpp_rewrite.serve.guard import shutting_down
from fdpp_rewrite.serve.requests import Delta, Finish, QueueFull, Request, ShuttingDown
from fdpp_rewrite.serve.schemas import APIError, ChatRequest, CompletionRequest, error_body

DEFAULT_MAX_TOKENS = 16  # /v1/completions' default, as OpenAI's; chat defaults to the room left in the sequence
RETRY_AFTER_S = 1
FAILURE_STATUS = {"timeout": (504, "timeout", "request_timeout"), "engine": (500, "server_error", "engine_failed"),
                  "shutdown": (503, "server_error", "shutting_down")}


def create_app(scheduler, tokenizer, model_name: str, request_timeout: float) -> FastAPI:
    engine = scheduler.engine
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()

        def deliver(batch: list) -> None:  # on the scheduler thread: one wake-up of the loop per iteration
            try:
                loop.call_soon_threadsafe(hand_over, batch)
            except RuntimeError:  # the loop has closed (shutdown): nobody is listening
                pass

        scheduler.deliver = deliver
        if scheduler.thread is None:
            scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="fdpp", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(status: int, body: dict, headers: dict | None = None) -> JSONResponse:
        scheduler.metrics.request_done("refused" if status < 500 or status == 503 else "failed")
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(_, exc: APIError):
        return refuse(exc.status, exc.body, exc.headers)

    @app.exception_handler(Exception)
    async def bug(_, exc: Exception):  # a bug: still OpenAI's shape for the client (Starlette logs the traceback)
        return refuse(500, error_body(f"internal server error ({type(exc).__name__}); see the server's log",
                                      "server_error", code="internal_error"))

    @app.exception_handler(HTTPException)
    async def http_error(_, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return refuse(exc.status_code, error_body(f"{exc.detail}: see docs/serving.md for the endpoints", kind))

    # -- endpoints ---------------------------------------------------------------------------------------------

    @app.get("/health")
    async def health():
        if scheduler.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        if scheduler.warming:
            return JSONResponse({"status": "warming up"}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        if not scheduler.healthy:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        status = {"status": "ok", "last_engine_error": scheduler.last_error}
        blocks = scheduler.kv_blocks()
        return status if blocks is None else {**status, "kv_blocks": blocks}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "fdpp", "max_model_len": scheduler.sequence_limit()[0]}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(scheduler.metrics.render(scheduler.gauges()),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(http: HttpRequest):
        body = await parse_body(await http.body(), CompletionRequest)
        check_model(body)
        if isinstance(body.prompt, str):
            prompt = encode(body.prompt, "prompt")
        else:
            prompt = body.prompt
        return await answer(body, prompt, body.max_tokens or DEFAULT_MAX_TOKENS, body.max_tokens is not None,
                            http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest):
        body = await parse_body(await http.body(), ChatRequest)
        check_model(body)
        if tokenizer is None or not tokenizer.chat_template:
            raise APIError(400, "this engine's tokenizer has no chat template; use /v1/completions", param="messages")
        prompt = encode_chat(tokenizer, [{"role": m.role, "content": m.text} for m in body.messages],
                             body.allow_special_tokens)
        limit = body.token_limit
        return await answer(body, prompt, limit or scheduler.sequence_limit()[0] - len(prompt), limit is not None,
                            http, chat=True)

    # -- one request -----------------------------------------------------------------------------------------

    def check_model(body) -> None:
        if body.model != model_name:
            raise APIError(404, f"the model {body.model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    def encode(text: str, param: str) -> list:
        if tokenizer is None:
            raise APIError(400, "this engine has no tokenizer; pass the prompt as a list of token ids", param=param)
        return tokenizer.encode(text)

    def check_limits(body, prompt: list, max_tokens: int, asked: bool) -> int:
        """The engine-dependent limits; returns max_tokens (a default is capped at the room left)."""
        param = "messages" if isinstance(body, ChatRequest) else "prompt"
        if not prompt:
            raise APIError(400, "the prompt is empty after tokenization", param=param)
        limit, what = scheduler.sequence_limit()
        if len(prompt) >= limit:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this server takes at most {limit - 1} "
                                f"({what}: {limit} tokens)", param=param, code="context_length_exceeded")
        if engine.vocab_size and (min(prompt) < 0 or max(prompt) >= engine.vocab_size):
            raise APIError(400, f"the prompt has token ids outside the vocabulary [0, {engine.vocab_size})",
                           param=param)
        room = limit - len(prompt)
        if not asked:
            max_tokens = min(max_tokens, room)
        elif max_tokens > room:
            raise APIError(400, f"the prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceed {what} "
                                f"({limit} tokens); lower max_tokens to {room} or less",
                           param="max_tokens", code="context_length_exceeded")
        if body.top_k > (engine.vocab_size or body.top_k):
            raise APIError(400, f"top_k: {body.top_k} exceeds the vocabulary of {engine.vocab_size}", param="top_k")
        return max_tokens

    async def answer(body, prompt: list, max_tokens: int, asked: bool, http: HttpRequest, chat: bool):
        if scheduler.warming:
            raise APIError(503, f"the server is warming up (tracing the engine's shapes, see --warmup); retry in "
                                f"{RETRY_AFTER_S} s", kind="server_error", code="warming_up",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        max_tokens = check_limits(body, prompt, max_tokens, asked)
        events: asyncio.Queue = asyncio.Queue()
        request = Request(prompt=prompt, max_tokens=max_tokens, emit=events.put_nowait, stop=body.stops,
                          sampler=Sampler(body.temperature, body.top_k, body.top_p, body.seed),
                          timeout_s=request_timeout)
        try:
            scheduler.submit(request)
        except ShuttingDown:
            raise shutting_down() from None
        except QueueFull:
            raise APIError(503, f"the server is busy: {scheduler.max_queue} requests are waiting already; retry in "
                                f"{RETRY_AFTER_S} s", kind="server_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        shape = ResponseShape(chat, model_name)
        if body.stream:
            return StreamingResponse(stream(request, events, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await collect(request, events, shape, http)

    async def stream(request: Request, events: asyncio.Queue, shape: ResponseShape):
        done = False
        try:
            if shape.chat:
                yield sse(shape.chunk(role=True))  # OpenAI's first chat chunk names the role
            while True:
                event = await events.get()
                if isinstance(event, Delta):
                    yield sse(shape.chunk(text=event.text))
                    continue
                done = True
                if isinstance(event, Finish):
                    yield sse(shape.chunk(finish=event))
                else:
                    _, kind, code = FAILURE_STATUS[event.kind]
                    yield sse(error_body(event.message, kind, code=code))
                yield "data: [DONE]\n\n"
                return
        finally:
            if not done:  # the client went away (the response task was cancelled)
                scheduler.cancel(request)

    async def collect(request: Request, events: asyncio.Queue, shape: ResponseShape, http: HttpRequest):
        disconnected = asyncio.ensure_future(wait_for_disconnect(http))
        parts = []
        try:
            while True:
                got = asyncio.ensure_future(events.get())
                await asyncio.wait({got, disconnected}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    scheduler.cancel(request)
                    return PlainTextResponse("", status_code=499)  # nobody reads it
                event = got.result()
                if isinstance(event, Delta):
                    parts.append(event.text)
                elif isinstance(event, Finish):
                    return JSONResponse(shape.whole("".join(parts), event))
                else:
                    status, kind, code = FAILURE_STATUS[event.kind]
                    return JSONResponse(error_body(event.message, kind, code=code), status_code=status)
        finally:
            disconnected.cancel()

    return app


def hand_over(batch: list) -> None:
    """On the event loop: the scheduler's events of one iteration, each to its request's queue."""
    for emit, event in batch:
        emit(event)


async def wait_for_disconnect(http: HttpRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class ResponseShape:
    """OpenAI's response and chunk objects of one request (completion or chat)."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _envelope(self, kind: str, choice: dict, usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}
        if usage is not None:
            body["usage"] = usage
        return body

    @staticmethod
    def usage(finish: Finish) -> dict:
        return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
                "total_tokens": finish.prompt_tokens + finish.completion_tokens}

    def chunk(self, text: str = "", role: bool = False, finish: Finish | None = None) -> dict:
        reason = finish.reason if finish else None
        usage = self.usage(finish) if finish else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            return self._envelope("chat.completion.chunk", {"index": 0, "delta": delta, "logprobs": None,
                                                            "finish_reason": reason}, usage)
        return self._envelope("text_completion", {"index": 0, "text": text, "logprobs": None,
                                                  "finish_reason": reason}, usage)

    def whole(self, text: str, finish: Finish) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish.reason}
            return self._envelope("chat.completion", choice, self.usage(finish))
        return self._envelope("text_completion", {"index": 0, "text": text, "logprobs": None,
                                                  "finish_reason": finish.reason}, self.usage(finish))
