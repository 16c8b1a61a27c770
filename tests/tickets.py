"""A request's ticket for code that runs outside any served route (the queue's unit tests):
carried as the routes carry it, in the ``RunnableConfig`` LangChain hands down (here the
one its own context variable holds for the runs started in this context)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from langchain_core.runnables.config import var_child_runnable_config

from ragchains.models.queue import Ticket, held_ticket, with_ticket


@contextmanager
def as_request(ticket: Ticket) -> Iterator[Ticket]:
    """The model calls made in this context (and the tasks and threads it starts) are
    ``ticket``'s request's."""
    token = var_child_runnable_config.set({"configurable": with_ticket({}, ticket)})
    try:
        yield ticket
    finally:
        var_child_runnable_config.reset(token)


@contextmanager
def request_ticket(max_wait: float | None = None) -> Iterator[Ticket]:
    """A request starts: a ticket of its own (closed at the end) for this context's calls."""
    with held_ticket(max_wait) as ticket, as_request(ticket):
        yield ticket
