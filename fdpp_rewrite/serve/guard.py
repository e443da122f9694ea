"""The ASGI layer in front of the app: what is refused before a request reaches an endpoint, and so before any of
it reaches the scheduler.

In order, for each HTTP request:
0. headers larger than MAX_HEADER_BYTES in all: 431 (h11 bounds only headers that arrive in several reads);
1. any path but OPEN_PATHS while the server shuts down: 503 `shutting_down`;
2. any path but OPEN_PATHS (so every /v1 route, and whatever path a client makes up) without
   `Authorization: Bearer <the key>` when the server has one: 401 `invalid_api_key` (the key is compared in
   constant time); /health and /metrics stay open, for probes and scrapers;
3. a Content-Length above the body limit (or not a number): 413 (400) at once, before any of the body is read;
4. the body read here, counted as it arrives (a chunked upload declares no length): 413 once past the limit, 408
   when it has not all arrived within the body timeout. The app then gets it as one message.
Each refusal is OpenAI's error object and closes the connection (the rest of an unread body would otherwise be
read as the next request). protocol.py enforces the limits before the headers are complete.
"""

from __future__ import annotations

import asyncio
import hmac
import json

from fdpp_rewrite.serve.limits import MAX_HEADER_BYTES, MIB, Limits
from fdpp_rewrite.serve.schemas import APIError, error_body

API_KEY_ENV = "FDPP_API_KEY"
OPEN_PATHS = ("/health", "/metrics")  # answered without a key, and during shutdown (/health then says so)


class Disconnected(Exception):
    """The client went away while sending its body."""


class Guard:
    def __init__(self, app, limits: Limits, scheduler, api_key: str | None = None):
        self.app, self.limits, self.scheduler = app, limits, scheduler  # scheduler.draining: shutting down
        self.metrics = scheduler.metrics
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            self.admit(scope)
            body = await self.read_body(scope, receive)
        except APIError as exc:
            self.metrics.request_done("refused")
            return await respond(send, exc.status, exc.body, exc.headers)
        except Disconnected:
            self.metrics.request_done("cancelled")
            return None
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: only http.disconnect is left to wait for
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    def admit(self, scope) -> None:
        if sum(len(key) + len(value) for key, value in scope["headers"]) > MAX_HEADER_BYTES:
            raise APIError(431, f"the request's headers are larger than {MAX_HEADER_BYTES} bytes in all")
        if scope["path"] in OPEN_PATHS:
            return
        if self.scheduler.draining:
            raise shutting_down()
        if self.expected is not None:
            given = header(scope, b"authorization")
            if given is None or not hmac.compare_digest(given, self.expected):
                raise APIError(401, "a valid API key is required: send the header `Authorization: Bearer <key>` "
                               "with the key the server was started with", code="invalid_api_key")

    async def read_body(self, scope, receive) -> bytes:
        limit = self.limits.max_body_bytes
        declared = header(scope, b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise APIError(400, f"the Content-Length header is not a number: {declared[:40]!r}")
            if len(declared) > 18 or int(declared) > limit:  # 18 digits: no int() of a huge number
                raise too_large(limit)
        deadline = asyncio.get_running_loop().time() + self.limits.body_timeout
        chunks, size = [], 0
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise APIError(408, f"the request body did not arrive within the server's body timeout of "
                                    f"{self.limits.body_timeout:g} s", code="request_timeout") from None
            if message["type"] == "http.disconnect":
                raise Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another replica", kind="server_error",
                    code="shutting_down")


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {limit / MIB:g} MiB "
                         "(see serve --max-body-mb)", code="request_too_large")


def header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def respond(send, status: int, body: dict, headers: dict | None = None) -> None:
    """A JSON response that closes the connection."""
    payload = json.dumps(body).encode()
    extra = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")] + extra})
    await send({"type": "http.response.body", "body": payload})


def error_response_bytes(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with OpenAI's error object, for protocol.py (below the ASGI layer)."""
    payload = json.dumps(error_body(message, "invalid_request_error" if status < 500 else "server_error",
                                    code=code)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
            "connection: close\r\n\r\n").encode() + payload
