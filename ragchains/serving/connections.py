"""A deadline for each request's line and headers: the connection is closed when they have
not all arrived in time.

uvicorn has none (its keep-alive timeout runs only between requests, and a byte received
stops it), so a client that opens connections and never finishes a request's headers holds
each open for good: 1,000 of them were all still open after 65 s. Its ``limit_concurrency``
is no answer: it counts those connections too, so they would turn every real request into a
503. The deadline is added to uvicorn's own h11 protocol class (what uvicorn runs here, and
the one it falls back to), as small a subclass as the hooks allow; naming it also keeps the
deadline whatever else is installed (uvicorn would pick httptools if it were).

    uvicorn --factory ragchains.server:create_app \\
        --http ragchains.serving.connections:HeaderTimeoutProtocol   # the default deadline
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragchains.settings import Settings

DEFAULT_HEADER_TIMEOUT: float = Settings.model_fields["header_timeout"].default


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not
    arrived within ``header_timeout`` seconds: from connecting, or, on a kept-alive
    connection, from the next request's first byte (idle, uvicorn's keep-alive timeout
    applies). A body then has its own deadline (BodyMiddleware's, 408)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    _deadline: asyncio.TimerHandle | None = None
    _begun = False  # some bytes of the awaited request have arrived

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.get_protocol() is not self:  # upgraded: another protocol's now
            self._disarm()
        elif self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            # h11 holds part of a request's head: the clock runs (from the connection, or
            # on a kept-alive one from this first byte).
            if self._deadline is None:
                self._arm()
            self._begun = True
        else:  # a head is complete (or bytes of a body, late or not): no deadline here
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._begun = False
        self._deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        if self._begun:  # a client that has started a request is told why it ends
            reason = (
                f"the request line and headers did not arrive within {self.header_timeout:g} "
                "seconds"
            ).encode()
            head = (
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(reason)
            )
            self.transport.write(head + reason)
        self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """HeaderTimeoutProtocol with a deadline of ``seconds``, for ``uvicorn.Config(http=...)``
    (uvicorn builds each connection's protocol from the class alone)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
