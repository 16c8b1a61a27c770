"""A request whose client has gone stops: its work is cancelled, and the model it held or
waited for goes to the next request at once.

Starlette runs an endpoint to its end whether or not anybody waits for its reply: a client
that gives up on ``/chat/invoke`` (a timeout, a closed tab, Stop) would keep its turn on the
model while an answer is written for nobody, and every later request would wait behind it.
(A streamed reply notices sooner, when it next writes or through sse-starlette's listener,
but only if it is writing.) So the request runs as a task of its own while this middleware
listens for the client's disconnect, and cancels it if the client goes before the reply is
complete. Everything the request started unwinds from there: the model's producer and its
ticket (``ragchains.models.queue``), an upstream's connection.

Listening takes nothing the route would read: the messages it receives (the body's, which
the route reads through ``BodyLimits`` inside this middleware) are handed on in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ragchains.models.queue import RequestEnded

log = logging.getLogger("ragchains.server")

Scope = dict[str, Any]
Message = dict[str, Any]

# Where a request whose client left before its reply started is marked, in its state (the
# request metrics count it as 499, nginx's "client closed request", not as a failure).
CLIENT_GONE = "ragchains_client_gone"
CLIENT_GONE_STATUS = 499


class CancelOnDisconnect:
    """ASGI middleware: requests to the paths ``watched`` accepts end when their client
    disconnects before their reply is complete (work after the reply, if any, runs on).
    ``on_departure(scope)`` runs first: it ends what the request started that cancelling its
    task would not reach (LangChain's RunnableParallel leaves the tasks of its branches
    running when its reader is cancelled, langchain-ai/langchain#40508)."""

    def __init__(
        self,
        app: Any,
        watched: Callable[[str], bool],
        on_departure: Callable[[Scope], None] = lambda scope: None,
    ) -> None:
        self.app = app
        self.watched = watched
        self.on_departure = on_departure

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.watched(scope["path"]):
            await self.app(scope, receive, send)
            return
        inbox: asyncio.Queue[Message] = asyncio.Queue()
        replied = started = False

        async def received() -> Message:
            message = await inbox.get()
            if message["type"] == "http.disconnect":
                inbox.put_nowait(message)  # whoever asks again is told again
            return message

        async def sending(message: Message) -> None:
            nonlocal replied, started
            started = started or message["type"] == "http.response.start"
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                replied = True

        async def listen() -> None:
            while True:
                message = await receive()
                inbox.put_nowait(message)
                if message["type"] == "http.disconnect":
                    return

        request = asyncio.create_task(self.app(scope, received, sending))
        listener = asyncio.create_task(listen())
        departed = False
        try:
            await asyncio.wait({request, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done() and not replied:  # the client went first
                departed = True
                self.on_departure(scope)
                request.cancel()
                if not started:
                    scope.setdefault("state", {})[CLIENT_GONE] = True
            await asyncio.wait({request})
        except asyncio.CancelledError:  # the server is stopping
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
            raise
        finally:
            listener.cancel()
        if request.cancelled():
            return
        if departed:  # whatever it ended with as it unwound, nobody is there to be told
            request.exception()
            return
        request.result()  # the route's own failure, for the error middleware


def quiet_departed_work(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """An event loop's exception handler: a task left running for a request whose client
    has gone, which then failed for that reason (``RequestEnded``), or which LangChain's
    RunnableParallel abandoned (its branch's ``StopAsyncIteration``), is no error of the
    service: both are the orphans of langchain-ai/langchain#40508, logged at debug level.
    Anything else goes to the default handler."""
    error = context.get("exception")
    task = context.get("future")
    coroutine = task.get_coro() if isinstance(task, asyncio.Task) else None
    name = getattr(coroutine, "__qualname__", "")
    if isinstance(error, RequestEnded) or (
        isinstance(error, StopAsyncIteration) and name.startswith("RunnableParallel.")
    ):
        log.debug("work left by a departed request ended: %r", error)
        return
    loop.default_exception_handler(context)
