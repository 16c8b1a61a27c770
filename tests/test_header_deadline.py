"""The header deadline (ragchains.serving.connections) on a real uvicorn server in this
process, over raw sockets: what is closed, what is answered, what is left alone."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragchains.serving.connections import HeaderTimeoutProtocol, header_timeout_protocol

DEADLINE = 0.4  # seconds; every wait below is a small multiple of it
KEEP_ALIVE = 5 * DEADLINE  # uvicorn's own, for idle kept-alive connections
SLOW_REPLY = 3 * DEADLINE


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] == "websocket.receive":
            await send({"type": "websocket.send", "text": message["text"]})
        return
    path = scope["path"]
    body = b""
    if path == "/early":  # answers before reading the body
        body = b"refused"
        status = 401
    else:
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status = 200
        if path == "/slow":
            await asyncio.sleep(SLOW_REPLY)
        body = b"%s %d" % (path.encode(), len(body))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=header_timeout_protocol(DEADLINE),
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield listener.getsockname()
    server.should_exit = True
    thread.join(10)


class Client:
    """A raw connection, read through a buffer (replies may arrive in one packet)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=KEEP_ALIVE + SLOW_REPLY)
        self.stream = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> bytes:
        """One reply: its head, then as many bytes as its content-length says."""
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = self.stream.readline()
            assert line, f"closed after {head!r}"
            head += line
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + self.stream.read(length)

    def until_closed(self) -> bytes:
        """Everything the server sends until it closes the connection."""
        try:
            got = self.stream.read()
        except ConnectionResetError:
            got = b""
        self.close()
        return got

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def test_it_wraps_uvicorns_protocol_rather_than_extending_it() -> None:
    assert not issubclass(HeaderTimeoutProtocol, H11Protocol)
    assert issubclass(header_timeout_protocol(1), asyncio.Protocol)
    assert header_timeout_protocol(1.5).header_timeout == 1.5


def test_a_silent_connection_is_closed_without_a_word(address: tuple[str, int]) -> None:
    conn = Client(address)
    started = time.monotonic()
    assert conn.until_closed() == b""
    assert DEADLINE * 0.9 <= time.monotonic() - started < DEADLINE + 5


def test_an_unfinished_head_gets_408_then_the_connection_closes(
    address: tuple[str, int],
) -> None:
    conn = Client(address)
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    ended = conn.until_closed()
    assert ended.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), ended
    assert b"\r\nconnection: close\r\n" in ended
    assert ended.endswith(b"did not arrive within 0.4 seconds")


def test_heads_arriving_in_pieces_in_time_are_answered(address: tuple[str, int]) -> None:
    conn = Client(address)
    time.sleep(DEADLINE / 2)  # the clock runs from connecting
    for piece in (b"GET /pieces HT", b"TP/1.1\r\nHo", b"st: x\r\n", b"\r\n"):
        conn.send(piece)
        time.sleep(DEADLINE / 10)
    assert conn.reply().endswith(b"/pieces 0")
    conn.close()


def test_kept_alive_the_clock_starts_at_the_next_requests_first_byte(
    address: tuple[str, int],
) -> None:
    conn = Client(address)
    conn.send(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.reply().startswith(b"HTTP/1.1 200")
    time.sleep(2 * DEADLINE)  # idle between requests: uvicorn's keep-alive timeout's
    conn.send(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.reply().endswith(b"/second 0")
    time.sleep(2 * DEADLINE)
    conn.send(b"GET /third HTTP/1.1\r\nHo")
    started = time.monotonic()
    assert conn.until_closed().startswith(b"HTTP/1.1 408")
    assert DEADLINE * 0.9 <= time.monotonic() - started < DEADLINE + 5


def test_a_complete_head_disarms_it_the_body_is_not_its_business(
    address: tuple[str, int],
) -> None:
    conn = Client(address)
    conn.send(b"POST /body HTTP/1.1\r\nHost: x\r\nCONTENT-length: 4\r\n\r\nab")
    time.sleep(2 * DEADLINE)
    conn.send(b"cd")
    assert conn.reply().endswith(b"/body 4")
    # Chunked, in pieces, past the deadline too; then the next request on the connection.
    conn.send(b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-ENCODING: chunked\r\n\r\n")
    time.sleep(2 * DEADLINE)
    conn.send(b"3\r\nabc\r\n")
    time.sleep(DEADLINE)
    conn.send(b"0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.reply().endswith(b"/chunked 3")
    assert conn.reply().endswith(b"/after 0")
    conn.close()


def test_a_body_after_an_early_reply_is_not_taken_for_a_head(address: tuple[str, int]) -> None:
    conn = Client(address)
    conn.send(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
    assert conn.reply().startswith(b"HTTP/1.1 401")
    conn.send(b"{")
    time.sleep(2 * DEADLINE)
    conn.send(b"}")
    time.sleep(2 * DEADLINE)
    conn.send(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.reply().endswith(b"/next 0")
    conn.close()


def test_pipelined_requests_are_each_answered(address: tuple[str, int]) -> None:
    conn = Client(address)
    conn.send(
        b"POST /one HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /two HTTP/1.1\r\nHost: x\r\n\r\nGET /three HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert [conn.reply().rsplit(b"\r\n", 1)[1] for _ in range(3)] == [
        b"/one 3",
        b"/two 0",
        b"/three 0",
    ]
    conn.close()


def test_an_unfinished_pipelined_head_does_not_cut_the_reply_before_it(
    address: tuple[str, int],
) -> None:
    """uvicorn holds a pipelined head until its reply to the request before is done (longer
    than the deadline here): the reply arrives whole. From then on the head waits as an
    idle connection does, until uvicorn's keep-alive timeout, or the deadline from its next
    byte."""
    conn = Client(address)
    conn.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHo")
    assert conn.reply().endswith(b"/slow 0")
    replied = time.monotonic()
    assert conn.until_closed() == b""  # uvicorn's keep-alive timeout, which says nothing
    assert KEEP_ALIVE * 0.9 <= time.monotonic() - replied < KEEP_ALIVE + 5
    conn = Client(address)
    conn.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHo")
    assert conn.reply().endswith(b"/slow 0")
    conn.send(b"st")
    sent = time.monotonic()
    assert conn.until_closed().startswith(b"HTTP/1.1 408")
    assert DEADLINE * 0.9 <= time.monotonic() - sent < DEADLINE + 5


def test_a_malformed_head_is_uvicorns_to_answer(address: tuple[str, int]) -> None:
    conn = Client(address)
    conn.send(b"NOT HTTP AT ALL\r\n\r\n")
    assert conn.until_closed().startswith(b"HTTP/1.1 400")


def test_a_websocket_is_left_alone(address: tuple[str, int]) -> None:
    conn = Client(address)
    conn.send(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += conn.stream.readline()
    assert head.startswith(b"HTTP/1.1 101"), head
    time.sleep(2 * DEADLINE)
    # One masked text frame, "hi" (the mask is zero: the payload goes as it is).
    conn.send(bytes([0x81, 0x82, 0, 0, 0, 0]) + b"hi")
    assert conn.stream.read(4) == bytes([0x81, 0x02]) + b"hi"
    conn.close()


def test_many_stalled_connections_are_all_closed_while_others_are_answered(
    address: tuple[str, int],
) -> None:
    stalled = [Client(address) for _ in range(100)]
    for conn in stalled[::2]:
        conn.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    answered = Client(address)
    answered.send(b"GET /meanwhile HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answered.reply().endswith(b"/meanwhile 0")
    answered.close()
    endings = [conn.until_closed() for conn in stalled]
    assert all(end.startswith(b"HTTP/1.1 408") for end in endings[::2])
    assert endings[1::2] == [b""] * 50
