"""The one typed settings object: environment variables (prefix ``RAGCHAINS_``) and ``.env``."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
DEFAULT_RERANKER = "cross-encoder/ms-marco-MiniLM-L-6-v2"


class Settings(BaseSettings):
    """Everything that can be tuned without code. Read once, passed to the factory."""

    model_config = SettingsConfigDict(
        env_prefix="RAGCHAINS_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # Models. The defaults work offline: the embedder's weights ship in a Python package;
    # the reranker id is tried from the local Hugging Face cache and falls back when missing.
    embedding_model: str = Field(
        DEFAULT_EMBEDDER,
        description="sentence-transformers model id or local path; the default ships in a package",
    )
    embedding_batch_size: int = Field(64, ge=1)
    reranker_model: str = Field(
        DEFAULT_RERANKER, description="CrossEncoder hub id (from the local cache) or local path"
    )
    device: str = "cpu"
    offline: bool = Field(True, description="forbid model downloads at run time (HF_HUB_OFFLINE=1)")

    # Chunking, in tokens of the embedder's own tokenizer.
    chunk_size: int = Field(200, ge=16, le=4096)
    chunk_overlap: int = Field(40, ge=0)

    # Retrieval.
    k: int = Field(10, ge=1, le=1000, description="chunks returned by hybrid retrieval")
    candidates_per_retriever: int = Field(
        50, ge=1, description="how many each of BM25 and dense fetch before fusion"
    )
    rrf_k: int = Field(60, ge=1)
    bm25_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    hnsw_min_chunks: int = Field(
        50_000, ge=1, description="indexes with at least this many chunks use HNSW, else exact"
    )

    # Compression (rerank).
    rerank_top_n: int = Field(4, ge=1)
    rerank_threshold: float | None = Field(
        None, description="minimum compressor score; unset = the compressor's own default"
    )

    @model_validator(mode="after")
    def _check_overlap(self) -> Settings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than "
                f"chunk_size ({self.chunk_size})"
            )
        return self
