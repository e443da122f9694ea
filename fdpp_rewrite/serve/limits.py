"""What one client may take of the server: body size, the time it may spend sending a request or idling on a
connection, and how many connections may be open at once. The defaults are `serve`'s (server.py makes an option
of each field; docs/serving.md, "Deploying", lists them); guard.py and protocol.py enforce them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from fdpp_rewrite.errors import FdppError

MIB = 2**20
# h11's limit on a request line + headers (its own default); past it, 400 and the connection is closed
MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True)
class Limits:
    # a prompt of 128K tokens as a list of ids is about 1 MiB of JSON
    max_body_mb: float = 4.0
    # from a connection's first byte (or a new request's, on a kept-alive one) to the end of its headers
    header_timeout: float = 10.0
    # from the end of the headers to the end of the body
    body_timeout: float = 30.0
    # an idle kept-alive connection between two requests
    keep_alive_timeout: float = 5.0
    max_connections: int = 512

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)

    def check(self) -> None:
        """FdppError naming the option of the first value that is not a positive, finite number."""
        for field in fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise FdppError(f"--{field.name.replace('_', '-')} must be a positive number, got {value}")
