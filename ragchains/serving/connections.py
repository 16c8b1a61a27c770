"""A deadline for each request's line and headers: the connection is closed when they have
not all arrived in time.

uvicorn has none (its keep-alive timeout runs only between requests, and a byte received
stops it), so a client that opens connections and never finishes a request's headers holds
each open for good: 1,000 of them were all still open after 65 s. Its ``limit_concurrency``
is no answer: it counts those connections too, so they would turn every real request into a
503.

The deadline sits around uvicorn's own h11 protocol, not inside it: HeaderTimeoutProtocol is
a plain asyncio protocol that builds uvicorn's ``H11Protocol`` with the arguments uvicorn
gave it and hands it every transport callback unchanged, reading and writing nothing of it
(its attributes are uvicorn's to rename in any release). To see where each request's head
begins and ends, it parses the same bytes with an h11 connection of its own: h11 is the
parser uvicorn runs, so both split the stream alike. The transport's public API tells the
rest: ``get_protocol()`` that a websocket has taken the connection over, ``is_reading()``
that uvicorn holds a pipelined head until its reply to the request before is done (the
head's wait is then uvicorn's keep-alive timeout's, which starts at that reply). Naming the
class also keeps the deadline whatever else is installed (uvicorn would pick httptools if
it were).

    uvicorn --factory ragchains.server:create_app \\
        --http ragchains.serving.connections:HeaderTimeoutProtocol   # the default deadline
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

import h11
from uvicorn import Config
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragchains.settings import Settings

DEFAULT_HEADER_TIMEOUT: float = Settings.model_fields["header_timeout"].default

# h11's end of a head (its own pattern): the first blank line.
_BLANK_LINE = re.compile(rb"\n\r?\n")


def _bodyless_head(data: bytes) -> int:
    """The length of the whole head ``data`` begins with, if it names neither header that
    gives a request a body (a GET's, as a rule); else 0.

    Such a head is passed over without parsing it (h11 would take about 20 µs): h11 ends it
    at the same blank line and frames the request with no body, so the next one begins right
    after. A head that h11 would reject is uvicorn's to answer (400, and closed)."""
    end = _BLANK_LINE.search(data)
    if end is None:
        return 0
    head = data[: end.end()].lower()
    if b"content-length" in head or b"transfer-encoding" in head:
        return 0
    return len(head)


class HeaderTimeoutProtocol(asyncio.Protocol):
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not
    arrived within ``header_timeout`` seconds: from connecting, or, on a kept-alive
    connection, from the next request's first byte (idle, uvicorn's keep-alive timeout
    applies). A client that had begun a request is told so (408) first. A body then has
    its own deadline (BodyLimits', 408); a websocket, once upgraded, has none."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, config: Config, **uvicorn_state: Any) -> None:
        # uvicorn builds each connection's protocol as cls(config=, server_state=,
        # app_state=, _loop=): all of it goes to its own protocol as it came.
        self._http = H11Protocol(config=config, **uvicorn_state)
        # The same head size limit as uvicorn's parser: a smaller one would give up on a
        # head that uvicorn still waits for.
        self._limit = config.h11_max_incomplete_event_size
        self._parser: h11.Connection | None = self._new_parser()  # None: no longer followed
        self._partial = False  # bytes of a head that is not complete yet have arrived
        self._deadline: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    # asyncio's protocol callbacks: uvicorn's protocol gets each first, as it would alone.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._http.connection_made(self._transport)
        self._arm()  # from connecting: a silent client is timed too

    def data_received(self, data: bytes) -> None:
        self._http.data_received(data)
        transport = self._transport
        if self._parser is None or transport is None:
            return
        if transport.get_protocol() is not self:
            self._stop()  # upgraded: the connection is a websocket's now
            return
        self._follow(data)
        # An unfinished head is timed from its first byte, unless uvicorn stopped reading
        # on receiving it: it is then a pipelined head held until the reply before it is
        # done, and from that reply on uvicorn's keep-alive timeout runs, as between any
        # two requests (the next byte to arrive starts the deadline).
        if self._partial and transport.is_reading():
            if self._deadline is None:
                self._arm()
        else:
            self._disarm()

    def eof_received(self) -> bool | None:
        self._http.eof_received()
        return None  # as uvicorn's (typed to return nothing): the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._http.connection_lost(exc)

    def pause_writing(self) -> None:
        self._http.pause_writing()

    def resume_writing(self) -> None:
        self._http.resume_writing()

    # The deadline.
    def _new_parser(self) -> h11.Connection:
        if self._limit is None:  # uvicorn's default is h11's
            return h11.Connection(h11.SERVER)
        return h11.Connection(h11.SERVER, max_incomplete_event_size=self._limit)

    def _follow(self, data: bytes) -> None:
        """Parses ``data`` as uvicorn does, request after request: ``_partial`` tells
        whether it ends inside a request's head."""
        while data and self._parser is not None:
            parser = self._parser
            if parser.their_state is h11.IDLE:
                # Not partial: the parser holds nothing yet, data begins a head.
                if not self._partial and (skip := _bodyless_head(data)):
                    data = data[skip:]
                    continue
                self._partial = True
            parser.receive_data(data)
            data = b""
            while True:
                try:
                    event = parser.next_event()
                except h11.RemoteProtocolError:  # uvicorn answers it (400) and closes
                    self._stop()
                    return
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.Request):  # the head is complete
                    self._partial = False
                elif isinstance(event, h11.EndOfMessage):
                    # The next request (pipelined, or after a reply) starts on a fresh parser:
                    # this one would wait for a reply it never sends.
                    data = parser.trailing_data[0]
                    self._parser = self._new_parser()
                    break
                elif event is h11.PAUSED:  # only after a request's end, handled above
                    self._stop()
                    return

    def _stop(self) -> None:
        self._parser = None
        self._partial = False
        self._disarm()

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        transport = self._transport
        if transport is None or transport.is_closing() or transport.get_protocol() is not self:
            return
        if self._partial:  # a client that has started a request is told why it ends
            reason = (
                f"the request line and headers did not arrive within {self.header_timeout:g} "
                "seconds"
            ).encode()
            head = (
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(reason)
            )
            transport.write(head + reason)
        transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """HeaderTimeoutProtocol with a deadline of ``seconds``, for ``uvicorn.Config(http=...)``
    (uvicorn builds each connection's protocol from the class alone)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
