"""uvicorn's h11 HTTP protocol with the limits a connection meets before its request reaches the ASGI app
(guard.py takes over once the headers are complete):

- a connection past `max_connections` open at once gets 503 (OpenAI's error object) and is closed;
- the headers of a request must be complete within `header_timeout` of the connection's first byte (of its
  opening, for a new connection: one that never sends anything is closed too), else 408 and closed;
- between two requests a connection may idle `keep_alive_timeout` (uvicorn's own timer);
- headers larger than MAX_HEADER_BYTES (h11's limit) and malformed requests get 400 as an OpenAI error object.
uvicorn arms no timer for a new connection nor for a request whose headers trickle in, hence this class.
h11 rather than httptools: its limits and parser are the same wherever the server is installed.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

from fdpp_rewrite.serve.guard import error_response_bytes
from fdpp_rewrite.serve.limits import Limits


def protocol_class(limits: Limits) -> type:
    """The protocol class uvicorn instantiates per connection (it takes no arguments of ours)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})


class GuardedProtocol(H11Protocol):
    limits: Limits

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.header_timer = None
        if len(self.connections) > self.limits.max_connections:
            self.refuse(503, "Service Unavailable", f"the server has its limit of {self.limits.max_connections} "
                        "connections open; retry later", "too_many_connections")
            return
        self.arm()

    def data_received(self, data: bytes) -> None:
        if self.awaiting_headers() and self.header_timer is None:  # a new request's first byte on a kept-alive one
            self.arm()
        super().data_received(data)
        if not self.awaiting_headers():
            self.disarm()

    def connection_lost(self, exc) -> None:
        self.disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.logger.warning(msg)
        self.refuse(400, "Bad Request", "the request is not valid HTTP/1.1, or its headers are larger than "
                    f"{self.config.h11_max_incomplete_event_size} bytes", "invalid_http")

    # -- the header timer --------------------------------------------------------------------------------------

    def awaiting_headers(self) -> bool:
        """No request is in progress: the next bytes are a new request's line and headers."""
        return self.cycle is None or self.cycle.response_complete

    def arm(self) -> None:
        self.header_timer = self.loop.call_later(self.limits.header_timeout, self.headers_late)

    def disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def headers_late(self) -> None:
        self.header_timer = None
        if self.awaiting_headers():
            self.refuse(408, "Request Timeout", "the request's headers did not arrive within the server's header "
                        f"timeout of {self.limits.header_timeout:g} s", "request_timeout")

    def refuse(self, status: int, reason: str, message: str, code: str) -> None:
        if not self.transport.is_closing():
            self.transport.write(error_response_bytes(status, reason, message, code))
            self.transport.close()
