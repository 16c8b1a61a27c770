"""Chat models over an OpenAI-compatible server (OpenAI, Azure OpenAI, Ollama, vLLM,
llama.cpp's server), and what a model's failure means to the caller.

The one module that imports ``langchain_openai`` (the embedded model: ``ragchains.
embedded_llm``). A builder returns a ``chains.llm.LLM`` that says how to count the model's
tokens and how it can be made to give structured replies.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from ragchains.chains.llm import LLM, approximate_tokens

log = logging.getLogger(__name__)


class LLMConfigError(ValueError):
    """The settings do not describe a usable chat model."""


def openai_llm(
    *,
    model: str,
    base_url: str | None = None,
    api_key: SecretStr | str | None = None,
    timeout: float = 60.0,
    max_retries: int = 2,
    fallback_model: str | None = None,
) -> LLM:
    """Any OpenAI-compatible chat endpoint: OpenAI, Azure OpenAI (its /openai/v1 base URL),
    Ollama, vLLM. The OpenAI client retries connection errors, 408, 429 and 5xx with
    exponential backoff; after that the fallback model, if any, gets the same request."""

    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if not key:
        if base_url is None:
            raise LLMConfigError(
                "the openai provider needs RAGCHAINS_OPENAI_API_KEY (or a "
                "RAGCHAINS_OPENAI_BASE_URL for a local server that needs no key)"
            )
        key = "not-needed"  # local servers (Ollama, vLLM) ignore the key; the client wants one

    def chat(name: str) -> Any:
        return _checked_chat_openai()(
            model=name,
            base_url=base_url,
            api_key=SecretStr(key),
            timeout=timeout,
            max_retries=max_retries,
        )

    primary = chat(model)

    tiktoken_failed = threading.Event()

    def count_tokens(text: str) -> int:
        if not tiktoken_failed.is_set():
            try:
                return int(primary.get_num_tokens(text))
            except Exception as exc:  # tiktoken downloads its encodings on first use
                tiktoken_failed.set()
                log.warning("token counting falls back to an estimate: %s", exc)
        return approximate_tokens(text)

    runnable = primary.with_fallbacks([chat(fallback_model)]) if fallback_model else primary

    return LLM(
        model=runnable,
        name=model,
        count_tokens=count_tokens,
        tool_calling=True,
        grammar=False,
    )


class UpstreamReplyError(Exception):
    """The chat model's server answered 200 with something that is no chat completion (an
    HTML page from a proxy, JSON without choices, a stream without chunks)."""


@functools.cache
def _checked_chat_openai() -> type[Any]:
    """``ChatOpenAI`` whose upstream's malformed replies are the upstream's failures
    (``UpstreamReplyError``: 502), not ValueErrors and TypeErrors that look like ours."""
    from langchain_openai import ChatOpenAI

    class CheckedChatOpenAI(ChatOpenAI):
        """Through BaseChatModel's own hooks (``_generate``, ``_stream`` and their async
        twins, which every chat model implements): a reply the client cannot read as a
        chat completion, and a stream that ends without saying why it finished (no
        ``finish_reason``: cut off, or chunks without choices), are
        ``UpstreamReplyError``s."""

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            with _read_as_completion():
                return super()._generate(*args, **kwargs)

        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            with _read_as_completion():
                return await super()._agenerate(*args, **kwargs)

        def _stream(self, *args: Any, **kwargs: Any) -> Any:
            finished = _Finished()
            with _read_as_completion():
                for chunk in super()._stream(*args, **kwargs):
                    yield finished.seen(chunk)
            finished.check()

        async def _astream(self, *args: Any, **kwargs: Any) -> Any:
            finished = _Finished()
            with _read_as_completion():
                async for chunk in super()._astream(*args, **kwargs):
                    yield finished.seen(chunk)
            finished.check()

    return CheckedChatOpenAI


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

    for error in _causes(exc):
        if isinstance(error, openai.APITimeoutError | httpx.TimeoutException):
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


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the members of exception groups (anyio task groups raise those) and causes."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        error = pending.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        if error.__cause__ is not None:
            pending.append(error.__cause__)


def _short(error: object, limit: int = 200) -> str:
    text = " ".join(str(getattr(error, "message", None) or error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
