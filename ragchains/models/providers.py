"""Chat models over an OpenAI-compatible server (OpenAI, Azure OpenAI, Ollama, vLLM,
llama.cpp's server), and what a model's failure means to the caller.

The one module that imports ``langchain_openai`` (the embedded model:
``ragchains.models.embedded``). A builder returns a ``chains.llm.LLM`` that says how to count
the model's tokens and how it can be made to give structured replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from langchain_core.exceptions import ModelError
from pydantic import SecretStr

from ragchains.chains.llm import LLM, approximate_tokens
from ragchains.models.queue import ModelQueue, causes
from ragchains.models.queued import QueuedChatModel

log = logging.getLogger(__name__)


class LLMConfigError(ValueError):
    """The settings do not describe a usable chat model."""


# OpenAI's own API; any other base URL is a server of someone else's making.
OPENAI_DEFAULT_MODEL = "gpt-4o-mini"
# How long ``probe_server`` waits for each of the server's descriptions.
PROBE_SECONDS = 5.0


@dataclass(frozen=True)
class ServerTraits:
    """What an OpenAI-compatible server says about itself: the models it serves (its
    ``/v1/models``) and the request field, if any, that takes a GBNF grammar."""

    models: tuple[str, ...] = ()
    grammar_field: str | None = None


# The body fields that take a GBNF grammar, by server: llama-cpp-python's and llama.cpp's
# servers take ``grammar``, vLLM ``guided_grammar`` (``structured_outputs`` from 0.10).
GRAMMAR_FIELDS = ("grammar", "guided_grammar", "structured_outputs")


def probe_server(base_url: str, api_key: str, *, seconds: float = PROBE_SECONDS) -> ServerTraits:
    """Ask the server what it serves and whether it takes a grammar: ``/v1/models``, then
    its OpenAPI description (llama-cpp-python, vLLM) or ``/props`` (llama.cpp's own server).
    What it does not answer is not assumed: no models, no grammar."""
    import httpx

    base = base_url.rstrip("/")
    origin = base.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(timeout=seconds, headers=headers) as client:
        listed = _json(client, f"{base}/models")
        data = listed.get("data") if isinstance(listed, dict) else None
        models = tuple(
            str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
        )
        described = _json(client, f"{origin}/openapi.json")
        schemas = described.get("components", {}).get("schemas", {}) if described else {}
        fields: set[str] = set()
        for name in ("CreateChatCompletionRequest", "ChatCompletionRequest"):
            schema = schemas.get(name) if isinstance(schemas, dict) else None
            if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
                fields |= set(schema["properties"])
        field = next((f for f in GRAMMAR_FIELDS if f in fields), None)
        if field is None and not described:
            props = _json(client, f"{origin}/props")
            if isinstance(props, dict) and "default_generation_settings" in props:
                field = "grammar"
    return ServerTraits(models, field)


def _json(client: Any, url: str) -> Any:
    """The JSON a GET of ``url`` answers with, or None (not there, not JSON, unreachable)."""
    import httpx

    try:
        response = client.get(url)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def server_options(field: str | None) -> Any:
    """``chains.llm.LLM.call_options`` for a server that is not OpenAI's: max_tokens as the
    server's own field (the client sends OpenAI's newer max_completion_tokens, which
    llama.cpp's server ignores) and the grammar in the field the server takes it in."""

    def options(max_tokens: int, grammar: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": max_tokens}
        if grammar is not None and field == "structured_outputs":
            body[field] = {"grammar": grammar}
        elif grammar is not None and field is not None:
            body[field] = grammar
        return {"max_tokens": max_tokens, "extra_body": body}

    return options


def openai_llm(
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: SecretStr | str | None = None,
    timeout: float = 60.0,
    max_retries: int = 2,
    fallback_model: str | None = None,
    grammar: str = "auto",
    offline: bool = True,
    concurrency: int = 64,
) -> LLM:
    """Any OpenAI-compatible chat endpoint: OpenAI, Azure OpenAI (its /openai/v1 base URL),
    Ollama, vLLM, llama.cpp's server.

    A server at ``base_url`` is asked what it serves (``probe_server``): without a ``model``
    the first model it lists answers, and the name shown is the server's; a grammar field it
    takes makes quote-style answers possible (``grammar``: auto, or the field to use, or
    none). ``timeout`` is the deadline of one call, retries included: connection errors, 408,
    429 and 5xx are retried with backoff while time remains; after that the fallback model,
    if any, gets the same request. Tokens are counted by tiktoken only for OpenAI's own API
    and not ``offline`` (its encodings download on first use); otherwise estimated.
    ``concurrency``: calls sent to the server at once (the model and its fallback share
    them); more wait in a queue, in order of their request's arrival
    (``ragchains.models.queue``)."""

    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if not key:
        if base_url is None:
            raise LLMConfigError(
                "the openai provider needs RAGCHAINS_OPENAI_API_KEY (or a "
                "RAGCHAINS_OPENAI_BASE_URL for a local server that needs no key)"
            )
        key = "not-needed"  # local servers (Ollama, vLLM) ignore the key; the client wants one
    traits = probe_server(base_url, key) if base_url is not None else ServerTraits()
    name = model or (traits.models[0] if traits.models else OPENAI_DEFAULT_MODEL)
    if base_url is not None and not traits.models:
        log.warning("%s lists no models (GET /models); asking for %r", base_url, name)
    elif traits.models and name not in traits.models:
        log.warning("%s serves %s, not %r", base_url, ", ".join(traits.models), name)
    field = traits.grammar_field if grammar == "auto" else None if grammar == "none" else grammar

    queue = ModelQueue(concurrency)  # one server: its parallel slots, whichever model

    def chat(name: str) -> QueuedChatModel:
        checked = _checked_chat_openai()(
            model=name,
            base_url=base_url,
            api_key=SecretStr(key),
            timeout=timeout,
            max_retries=0,  # retried within the deadline: CheckedChatOpenAI
            deadline=timeout,
            retries=max_retries,
        )
        # Its calls first take a turn in the queue: the deadline of a call starts with its turn.
        return QueuedChatModel(model=checked, queue=queue)

    primary = chat(name)
    runnable = primary.with_fallbacks([chat(fallback_model)]) if fallback_model else primary
    count_tokens = approximate_tokens
    if base_url is None and not offline:
        count_tokens = _tiktoken_or_estimate(primary)
    return LLM(
        model=runnable,
        # What the server says it serves, when it says (one model: whatever was asked for).
        name=traits.models[0] if len(traits.models) == 1 else name,
        count_tokens=count_tokens,
        tool_calling=True,
        grammar=field is not None,
        call_options=server_options(field) if base_url is not None else _openai_options,
    )


def _openai_options(max_tokens: int, grammar: str | None) -> dict[str, Any]:
    return {"max_tokens": max_tokens}


def _tiktoken_or_estimate(model: Any) -> Any:
    failed = threading.Event()

    def count_tokens(text: str) -> int:
        if not failed.is_set():
            try:
                return int(model.get_num_tokens(text))
            except Exception as exc:  # tiktoken downloads its encodings on first use
                failed.set()
                log.warning("token counting falls back to an estimate: %s", exc)
        return approximate_tokens(text)

    return count_tokens


class UpstreamReplyError(ModelError):
    """The chat model's server answered 200 with something that is no chat completion (an
    HTML page from a proxy, JSON without choices, a stream without chunks), or ended a
    stream before saying it had finished. A LangChain ``ModelError``, as langchain-openai's
    own failures are: a stream that fails after the answer has begun is kept, marked
    incomplete (``chains.answer``)."""


class ModelDeadlineExceeded(TimeoutError):
    """One chat model call, retries included, took longer than its deadline."""


class _Deadline:
    """The time left for one call; each attempt gets what remains as its HTTP timeout."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.ends = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        return None if self.ends is None else self.ends - time.monotonic()

    def options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        left = self.remaining()
        if left is None:
            return kwargs
        if left <= 0:
            raise ModelDeadlineExceeded(f"no answer within {self.seconds:g} s")
        return {**kwargs, "timeout": left}

    def retrying(self, retries: int, kind: type[Any]) -> Any:
        """tenacity's ``Retrying`` (or ``AsyncRetrying``): what the OpenAI client retries
        (connection errors, 408, 409, 429, 5xx), with its backoff, while time remains."""
        import tenacity

        backoff = tenacity.wait_exponential_jitter(multiplier=0.5, max=8.0)

        def wait(state: Any) -> float:
            left = self.remaining()
            return backoff(state) if left is None else max(0.0, min(backoff(state), left))

        stop: Any = tenacity.stop_after_attempt(retries + 1)
        if self.seconds is not None:
            # No attempt that would start after the deadline, its backoff counted.
            stop = tenacity.stop_any(stop, tenacity.stop_before_delay(self.seconds))
        return kind(
            stop=stop,
            wait=wait,
            retry=tenacity.retry_if_exception(_retryable),
            reraise=True,
        )


def _retryable(error: BaseException) -> bool:
    import openai

    if isinstance(error, openai.APITimeoutError):
        return False  # it took the time that was left
    if isinstance(error, openai.APIConnectionError):
        return True
    return isinstance(error, openai.APIStatusError) and (
        error.status_code in (408, 409, 429) or error.status_code >= 500
    )


@functools.cache
def _checked_chat_openai() -> type[Any]:
    """``ChatOpenAI`` with one deadline per call and whose upstream's malformed replies are
    the upstream's failures (``UpstreamReplyError``: 502), not ValueErrors and TypeErrors
    that look like ours."""
    import tenacity
    from langchain_openai import ChatOpenAI

    class CheckedChatOpenAI(ChatOpenAI):
        """Through BaseChatModel's own hooks (``_generate``, ``_stream`` and their async
        twins, which every chat model implements):

        - ``deadline`` bounds a call, its retries included (``retries`` of them, with
          backoff); a stream's deadline is for its first chunk, after which the client's
          read timeout watches the gaps;
        - a reply the client cannot read as a chat completion, and a stream that ends
          without saying why it finished (no ``finish_reason``: cut off, or chunks
          without choices), are ``UpstreamReplyError``s, raised once the chunks that did
          arrive have been passed on."""

        deadline: float | None = None
        retries: int = 0

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            clock = _Deadline(self.deadline)
            for attempt in clock.retrying(self.retries, tenacity.Retrying):
                with attempt, _read_as_completion():
                    return super()._generate(*args, **clock.options(kwargs))
            raise AssertionError("tenacity reraises the last failure")

        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            clock = _Deadline(self.deadline)
            async for attempt in clock.retrying(self.retries, tenacity.AsyncRetrying):
                with attempt, _read_as_completion():
                    return await _within(clock, super()._agenerate(*args, **clock.options(kwargs)))
            raise AssertionError("tenacity reraises the last failure")

        def _stream(self, *args: Any, **kwargs: Any) -> Any:
            clock, finished = _Deadline(self.deadline), _Finished()
            for attempt in clock.retrying(self.retries, tenacity.Retrying):
                with attempt, _read_as_completion():
                    chunks = super()._stream(*args, **clock.options(kwargs))
                    first = next(chunks, None)
            with _read_as_completion():
                if first is not None:
                    yield finished.seen(first)
                    for chunk in chunks:
                        yield finished.seen(chunk)
            finished.check()

        async def _astream(self, *args: Any, **kwargs: Any) -> Any:
            clock, finished = _Deadline(self.deadline), _Finished()
            async for attempt in clock.retrying(self.retries, tenacity.AsyncRetrying):
                with attempt, _read_as_completion():
                    chunks = super()._astream(*args, **clock.options(kwargs))
                    first = await _within(clock, anext(chunks, None))
            with _read_as_completion():
                if first is not None:
                    yield finished.seen(first)
                    async for chunk in chunks:
                        yield finished.seen(chunk)
            finished.check()

    return CheckedChatOpenAI


async def _within(clock: _Deadline, awaitable: Any) -> Any:
    """``awaitable``'s result, or ``ModelDeadlineExceeded`` once the deadline passes."""
    left = clock.remaining()
    try:
        return await asyncio.wait_for(awaitable, left)
    except TimeoutError as exc:
        raise ModelDeadlineExceeded(f"no answer within {clock.seconds:g} s") from exc


_NOT_A_COMPLETION = "the chat model's server answered with something that is not a chat completion"


_BROKE_OFF = "the chat model's server ended its stream before the answer was finished"


class _Finished:
    """Watches a stream's chunks for the choice that says why it finished: an OpenAI
    stream's last choice carries a ``finish_reason`` (stop, length, tool_calls)."""

    def __init__(self) -> None:
        self.said_anything = False
        self.finished = False

    def seen(self, chunk: Any) -> Any:
        self.said_anything = self.said_anything or bool(chunk.text)
        self.finished = self.finished or bool((chunk.generation_info or {}).get("finish_reason"))
        return chunk

    def check(self) -> None:
        if not self.finished:
            raise UpstreamReplyError(_BROKE_OFF if self.said_anything else _NOT_A_COMPLETION)


@contextlib.contextmanager
def _read_as_completion() -> Iterator[None]:
    """What the OpenAI client raises reading a 200 that is no chat completion (an HTML page
    from a proxy, JSON without choices) is the upstream's failure, not one that looks like
    ours. Failures the client reports as such (``openai.APIError``) pass unchanged."""
    import openai

    try:
        yield
    except openai.APIError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise UpstreamReplyError(_NOT_A_COMPLETION) from exc


@dataclass(frozen=True)
class LLMFailure:
    """A chat model call that failed for a reason outside ragchains: ``message`` says it for
    the caller (the status and what it means, never the upstream's own words: they may echo
    a credential); ``detail`` has those words, credentials masked, for the server's log."""

    timed_out: bool
    message: str
    detail: str = ""


# What an upstream status means, for the caller.
_STATUS_MEANING = {
    400: "refused the request",
    401: "refused the server's credentials",
    403: "refused the server's credentials",
    404: "does not know the model or the route",
    408: "timed out",
    413: "found the request too large",
    422: "refused the request",
    429: "is rate-limiting or out of capacity",
}


def explain_failure(exc: BaseException) -> LLMFailure | None:
    """What went wrong if ``exc`` (or an exception it groups or wraps) is a model failure.

    None for anything else: those are bugs or bad input, reported differently.
    """
    import httpx
    import openai

    for error in causes(exc):
        if isinstance(
            error, openai.APITimeoutError | httpx.TimeoutException | ModelDeadlineExceeded
        ):
            return LLMFailure(True, "the chat model did not answer in time")
        if isinstance(error, openai.APIStatusError):
            status = error.status_code
            meaning = _STATUS_MEANING.get(status, "failed" if status >= 500 else "refused")
            body = error.body if isinstance(error.body, dict) else {}
            said = _short(body["message"]) if body.get("message") else _short(error)
            return LLMFailure(False, f"the chat model's server {meaning} ({status})", masked(said))
        if isinstance(error, openai.APIConnectionError | httpx.TransportError):
            return LLMFailure(False, "the chat model's server cannot be reached")
        if isinstance(error, UpstreamReplyError):
            cause = error.__cause__
            return LLMFailure(False, str(error), masked(_short(cause)) if cause else "")
        if isinstance(error, openai.APIError):
            return LLMFailure(
                False, f"the chat model failed ({type(error).__name__})", masked(_short(error))
            )
    return None


# Credentials an upstream's error text may echo: bearer tokens, OpenAI-style keys.
_CREDENTIALS = re.compile(r"(?i)(bearer\s+|api[_-]?key[\"']?\s*[:=]\s*[\"']?)\S+|\bsk-[\w-]{6,}")


def masked(text: str) -> str:
    """``text`` with credentials it may hold replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: (m.group(1) or "") + "***", text)


def _short(error: object, limit: int = 200) -> str:
    text = " ".join(str(getattr(error, "message", None) or error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
